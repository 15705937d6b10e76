"""The LM head of a decode step, read at a quarter of the bytes, with the same argmax.

In a float32 decode step of Qwen2.5-Coder 0.5B the LM head (151936 x 896,
tied to the embedding) is 545 MB of the 1.97 GB of weights the step reads:
over a quarter of its time on a bandwidth-bound CPU. Greedy decoding needs
only the argmax of the logits, and the argmax can be found exactly without
reading every float32 weight:

1. **Screen**: estimates of every vocabulary row's logit from an int8 copy of
   the head (w'_v = s_v q_v, s_v = max|w_v| / 127) and the hidden vector
   quantized the same way (h' = t h_int, t = max|h| / 127): the native
   kernel's `hs_screen_u8i8`, whose integer dot product is exact. A quarter
   of the weight bytes at a few instructions per 64 weights.
2. **Bound**: the float32 logit the full head computes, exact_v, and the
   estimate est_v differ by at most
       slack_v = a_v ||h|| + b_v (||h - h'|| + 5u ||h'||),
   a_v = ||w_v - w'_v|| + gamma ||w_v||, b_v = ||w'_v|| (both inflated by
   1e-3), u = 2^-24. Since w.h - w'.h' = (w - w').h + w'.(h - h'), the
   first terms bound the two quantizations (Cauchy-Schwarz); gamma ||w|| ||h||
   bounds the float32 kernel's own rounding (each output a sum of K
   products through fewer than max(K, 16) * 2 roundings: gamma =
   max(K, 16) * 2^-23), and 5u ||w'|| ||h'|| the estimate's (the int32 sum
   turned into a float and two products). a_v and b_v are computed once, in
   float64; the norms of h per call, in float64.
3. **Select**: every row whose upper bound est_v + slack_v reaches the
   largest lower bound max_u (est_u - slack_u) could be the argmax; no other
   row can (its exact logit is below some row's). Done in float64, two
   passes in the kernel (`hs_screen_select`).
4. **Recompute** those candidates (a few dozen rows for the random 0.5B,
   whose logits are flat; fewer for a peaked real model) with the float32
   kernel on their own weight rows: the kernel sums every output in one
   fixed order whatever the matrix or M, so each candidate's logit is the
   full head's bits.

The logits returned hold those exact values at the candidates and the
estimates elsewhere (within slack_v: about 0.3 for the random 0.5B). So the
greedy token, and the logits of every token that could be it, are
bit-identical to the full float32 head's (tested against it, near-ties
included); sampling at a temperature reads the others within their slack,
as every mode of the engine does alike. A head with a bias, a CPU without
AVX512-VNNI, forwards of more than `SCREEN_MAX_ROWS` rows wanting logits,
hidden states that are not finite, and a screen that leaves more than
`MAX_CANDIDATE_FRACTION` of the rows run the full float32 head.
"""

from __future__ import annotations

from typing import Callable

import torch

# screen heads of at least this many float32 bytes (the 0.5B's 545 MB; a tiny
# test model's 19 MB gains nothing from it)
SCREEN_MIN_BYTES = 64 << 20
# rows wanting logits in one forward up to which the screen is used: each row
# adds integer products over the int8 head and a recompute, and past 8 rows the
# full head costs less (the 0.5B's timings: docs/benchmarks-archive.md)
SCREEN_MAX_ROWS = 8
# past this share of candidates the recompute costs more than the full head
MAX_CANDIDATE_FRACTION = 0.25
_U = 2.0 ** -24
# slack_v's margins, as hs_screen_select (kernels/native.cpp) applies them:
# a relative one for the float64 arithmetic of the bound and a tiny absolute
# one (kept in step: the tests check the bound through `ScreenedHead.slack`)
_SLACK_MARGIN, _SLACK_FLOOR = 1 + 1e-9, 1e-30
_CHUNK_ROWS = 8192  # weight rows turned into float64 at a time for the bounds


class ScreenedHead:
    """The LM head as the module doc says: `head(rows)` -> float32 logits
    [R, vocab] whose argmax (and every candidate's value) is the full head's."""

    def __init__(self, full, store: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """`full`: the float32 head (`ops.native.NativeLinear`: the kernel up to
        its token count, oneDNN above). `store` places the int8 copy (e.g. in
        huge pages); default: as torch allocates it."""
        if full.weight.dtype != torch.float32:
            raise ValueError(f"a screened head needs float32 weights, not {full.weight.dtype}")
        self.full = full
        self.kernel, self.weight = full.kernel, full.weight
        self.out_features, self.in_features = full.out_features, full.in_features
        quantized, self.scale, self.qsum, self.a, self.b = quantize(full.weight)
        self.quantized = quantized if store is None else store(quantized)
        self.calls = 0  # rows screened (the others ran the full head)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        rows = flat.shape[0]
        if rows > SCREEN_MAX_ROWS or not bool(torch.isfinite(flat).all()):
            return self.full(x)
        xu, t, h_norm, off = self._quantized(flat)
        est = self.kernel.screen_u8i8(xu, t, self.quantized, self.qsum, self.scale)  # [R, vocab]
        cap = int(MAX_CANDIDATE_FRACTION * self.out_features)
        chosen = [self.kernel.screen_select(est[r], self.a, self.b, h_norm[r], off[r], cap) for r in range(rows)]
        if any(index is None for index in chosen):
            return self.full(x)
        for r, index in enumerate(chosen):
            exact = self.kernel.linear(flat[r:r + 1], self.weight.index_select(0, index))
            est[r].index_copy_(0, index, exact[0])
        self.calls += rows
        return est.view(*x.shape[:-1], self.out_features)

    def slack(self, flat: torch.Tensor) -> torch.Tensor:
        """slack_v of each hidden row (float32 [R, K], finite): float64 [R, V],
        as the kernel's candidate selection computes it."""
        _, _, h_norm, off = self._quantized(flat)
        hn = torch.tensor(h_norm, dtype=torch.float64)[:, None]
        off = torch.tensor(off, dtype=torch.float64)[:, None]
        return (self.a[None, :] * hn + self.b[None, :] * off) * _SLACK_MARGIN + _SLACK_FLOOR

    def _quantized(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[float], list[float]]:
        """The rows as the screen reads them (uint8 h_int + 128, the scales t),
        ||h|| and ||h - h'|| + 5u ||h'|| per row (module doc)."""
        wide = flat.double()
        h_int, t = int8_rows(flat)
        h_q = h_int.double() * t.double()[:, None]  # h' exactly
        off = (wide - h_q).norm(dim=1) + 5 * _U * h_q.norm(dim=1)
        return (h_int + 128).to(torch.uint8), t, wide.norm(dim=1).tolist(), off.tolist()


def int8_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `rows` (float32 [R, K]) quantized symmetrically: its
    integers in [-127, 127] (as float32) and its scale max|row| / 127 (1 for
    a zero row, whose integers are then 0, exactly)."""
    scale = rows.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(rows / scale[:, None]).clamp_(-127, 127), scale


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`weight` (float32 [V, K]) as int8 rows with float32 scales, their int32
    row sums, and a_v, b_v of the module doc (float64 [V])."""
    rows, k = weight.shape
    gamma = max(k, 16) * 2.0 ** -23
    q = torch.empty(rows, k, dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    a = torch.empty(rows, dtype=torch.float64)
    b = torch.empty(rows, dtype=torch.float64)
    for start in range(0, rows, _CHUNK_ROWS):
        w = weight[start:start + _CHUNK_ROWS]
        end = start + w.shape[0]
        w_int, s = int8_rows(w)
        q[start:end] = w_int.to(torch.int8)
        scale[start:end] = s
        wide = w.double()
        dequantized = w_int.double() * s.double()[:, None]
        a[start:end] = (wide - dequantized).norm(dim=1) + gamma * wide.norm(dim=1)
        b[start:end] = dequantized.norm(dim=1)
    qsum = q.sum(dim=1, dtype=torch.int32)
    return q, scale, qsum, a * (1 + 1e-3), b * (1 + 1e-3)


def screens(weight: torch.Tensor, bias: torch.Tensor | None, kernel, min_bytes: int | None = None) -> bool:
    """Whether a head of this weight is screened: float32, no bias, at least
    `min_bytes` (default `SCREEN_MIN_BYTES`), and a kernel with the screening
    pass (AVX512-VNNI)."""
    limit = SCREEN_MIN_BYTES if min_bytes is None else min_bytes
    return (weight.dtype == torch.float32 and bias is None and weight.numel() * weight.element_size() >= limit
            and getattr(kernel, "screen_available", False))
