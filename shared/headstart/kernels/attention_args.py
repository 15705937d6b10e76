"""The attention kernels' arguments: rows of new tokens over cache pieces, checked and marshalled.

Both attention kernels (the float engine's `native.cpp` and `quant.cpp`) take
the same arguments: q [tokens, heads, dim] and, per row, its new-token count
and its cache pieces (a shared prefix, its own tail, its new keys last),
each piece [1, kv_heads, L, dim] read in place by pointer.
"""

from __future__ import annotations

import ctypes

import torch


def attention_arrays(q: torch.Tensor, rows, dtypes: tuple[torch.dtype, ...]):
    """Validate an attention call's arguments and marshal its pieces for the
    kernel: (held tensors, the five ctypes arrays keys/values/lengths/kstride/
    vstride, each row's new tokens, each row's piece count, kv heads). The
    held tensors must live until the call returns."""
    if q.dim() != 3:
        raise ValueError(f"native attention: q [tokens, heads, dim] expected, got {tuple(q.shape)}")
    total, heads, dim = q.shape
    if q.dtype != torch.float32 or not q.is_contiguous() or not rows or any(not p for _, p in rows):
        raise ValueError("native attention: q float32 contiguous [tokens, heads, dim] and at least one cache "
                         "piece per row")
    if sum(nq for nq, _ in rows) != total:
        raise ValueError(f"native attention: the rows' new tokens ({sum(nq for nq, _ in rows)}) must be q's "
                         f"{total}")
    first = rows[0][1][0][0]
    dtype, kv_heads = first.dtype, first.shape[1]
    if dtype not in dtypes or heads % kv_heads:
        raise ValueError(f"native attention: {' or '.join(str(d).removeprefix('torch.') for d in dtypes)} cache "
                         f"with heads divisible by kv heads, got {dtype}, {heads} heads, {kv_heads} kv heads")
    held, nqs, nsegs = [], [], []  # (keys, values) as the kernel reads them
    for nq, pieces in rows:
        if nq < 1 or pieces[-1][0].shape[-2] < nq:
            raise ValueError(f"native attention: a row's last piece must hold its {nq} new tokens' keys")
        for keys, values in pieces:
            if keys.dtype != dtype or values.dtype != dtype or keys.shape[1] != kv_heads or keys.shape[-1] != dim:
                raise ValueError("native attention: every piece must have the first piece's dtype and shape")
            held.append((token_rows(keys), token_rows(values)))
        nqs.append(nq)
        nsegs.append(len(pieces))
    n = len(held)
    arrays = [(ctypes.c_void_p * n)(*(k.data_ptr() for k, _ in held)),
              (ctypes.c_void_p * n)(*(v.data_ptr() for _, v in held)),
              (ctypes.c_int64 * n)(*(k.shape[-2] for k, _ in held)),
              (ctypes.c_int64 * n)(*(k.stride(1) for k, _ in held)),
              (ctypes.c_int64 * n)(*(v.stride(1) for _, v in held))]
    return held, arrays, nqs, nsegs, kv_heads


def token_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` [1, kv_heads, L, dim] with each token's values contiguous (a copy only if not)."""
    if t.stride(-1) == 1 and (t.shape[-2] <= 1 or t.stride(-2) == t.shape[-1]):
        return t
    return t.contiguous()
