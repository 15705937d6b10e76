"""The `inductor` kernel set: each decoder layer's weight-bound blocks compiled.

`torch.compile` with `freezing` (weights become constants, prepacked once)
and `max-autotune` restricted to inductor's C++ GEMM template (its CPU
micro-GEMM; no autotuning against ATen, so a compile on a busy machine does
not pick a kernel by noise).

Per layer two graphs: `pre` (input norm, q/k/v projections) and `post`
(o projection, residual, post-attention norm, MLP, residual), and one for
the LM head. Attention stays outside, per row on the row's own cache
(`runner.row_attention`). Shapes: a graph is compiled for exactly one token (a lone
decode step, the case this path exists for) and one with the token count
dynamic (2 .. `MAX_COMPILED_TOKENS`: a batch of decode rows, a few typing
tokens), both at engine start (`warm`); larger forwards (prefill chunks,
which are compute-bound and run well in MKL) use the model's own modules.

Each graph gets its own code object (`_own_code`): dynamo caches compiled
graphs per code object, and 49 modules sharing one `forward` would hit its
recompile limit and silently fall back to eager.

Compile time on 2 cores is minutes for a 24-layer model; inductor's caches
(FX graph and C++ kernels) live under `TORCHINDUCTOR_CACHE_DIR`, which
`InductorOps` sets to `<run dir>/inductor` unless the user set it, so a
second start reuses them.
"""

from __future__ import annotations

import logging
import os
import time
import types

import torch

from headstart.engine.runner.ops.eager import EagerOps

log = logging.getLogger(__name__)

MAX_COMPILED_TOKENS = 64


class _Pre(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.norm = layer.input_layernorm
        self.q, self.k, self.v = layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj

    def forward(self, hidden):
        x = self.norm(hidden)
        return self.q(x), self.k(x), self.v(x)


class _Post(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.o, self.norm, self.mlp = layer.self_attn.o_proj, layer.post_attention_layernorm, layer.mlp

    def forward(self, out, residual):
        hidden = residual + self.o(out)
        return hidden + self.mlp(self.norm(hidden))


class _Head(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, rows):
        return self.head(rows)


def _own_code(module: torch.nn.Module, name: str):
    """`module.forward` as a bound method with a code object of its own."""
    fn = type(module).forward
    code = fn.__code__.replace(co_name=name)
    return types.MethodType(types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__), module)


def _configure_inductor() -> None:
    import torch._inductor.config as inductor_config

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_cache_dir()))
    inductor_config.freezing = True
    inductor_config.max_autotune_gemm_backends = "CPP"


def _cache_dir():
    from headstart.paths import run_dir

    return run_dir() / "inductor"


class _Compiled:
    """One block compiled for one token and, with `many`, for 2..MAX tokens
    (the token axis dynamic: one graph, one packed copy of the weights)."""

    def __init__(self, module: torch.nn.Module, name: str, many: bool):
        self.module = module
        self.one = torch.compile(_own_code(module, f"{name}_t1"), mode="max-autotune", dynamic=False,
                                 fullgraph=True)
        self.many = torch.compile(_own_code(module, f"{name}_tn"), mode="max-autotune",
                                  fullgraph=True) if many else None

    def __call__(self, *args):
        tokens = args[0].shape[-2]
        if tokens == 1:
            return self.one(*args)
        if self.many is not None and tokens <= MAX_COMPILED_TOKENS:
            for a in args:  # the token axis is dynamic: one graph for every count
                torch._dynamo.mark_dynamic(a, a.dim() - 2, min=2, max=MAX_COMPILED_TOKENS)
            return self.many(*args)
        return self.module(*args)


class InductorOps(EagerOps):
    """The model's layers through compiled blocks (module doc)."""

    name = "inductor"

    def __init__(self, model, warm_rows: tuple[int, ...] = (1, 2)):
        """`warm_rows`: token counts compiled now; 1 is always compiled, and
        any count above 1 compiles the dynamic graphs (without one, forwards
        of 2+ tokens use the model's own modules)."""
        super().__init__(model)
        _configure_inductor()
        counts = sorted({1, *warm_rows})
        many = counts[-1] > 1
        self._pre = [_Compiled(_Pre(layer), f"pre{i}", many) for i, layer in enumerate(self.layers)]
        self._post = [_Compiled(_Post(layer), f"post{i}", many) for i, layer in enumerate(self.layers)]
        self._head = _Compiled(_Head(model.lm_head), "head", many)
        # a dynamic graph is compiled at its first count >= 2; one count is enough
        self.compile_s = self.warm(tuple(counts[:2]))

    @torch.inference_mode()
    def warm(self, token_counts: tuple[int, ...]) -> float:
        """Compile every block for these token counts now (engine start), not
        on a user's first request. Returns the seconds it took."""
        start = time.perf_counter()
        param = next(self.model.parameters())
        hidden_size = self.model.config.hidden_size
        for n in sorted(set(token_counts)):
            hidden = torch.zeros(1, n, hidden_size, dtype=param.dtype, device=param.device)
            for i in range(len(self.layers)):
                q, _, _ = self.qkv(i, hidden)
                self.post(i, torch.zeros_like(q), hidden)
            self.head(hidden[0])
        seconds = time.perf_counter() - start
        log.info("inductor kernels compiled for %s tokens in %.1f s", sorted(set(token_counts)), seconds)
        return seconds

    def qkv(self, index: int, hidden: torch.Tensor):
        return self._pre[index](hidden)

    def post(self, index: int, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self._post[index](out, residual)

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        return self._head(rows)
