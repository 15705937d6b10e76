"""llama.cpp's C++ `llama-server` as the peer: parallel slots, continuous batching.

Built from the vendored source by `headstart peer build-server`
(`server_build.py`). Set here for a fair comparison, not left to defaults:
- `-np N` slots, one per concurrent user measured, with continuous batching
  (`-cb`): N requests decode together, as our replica batches its sessions;
- the context is N x the per-request context, one KV stream per slot
  (`--no-kv-unified`): a slot keeps its own prompt between requests, and its
  attention reads only its own cells (a unified buffer is masked across all);
- prompt caching on (`--cache-prompt`, and `cache_prompt: true` in each
  request): a request reuses the longest prefix its slot holds, and a slot
  is picked by prompt similarity; `--cache-reuse` stays 0 (off): it re-uses
  chunks *after* a difference by shifting their positions (RoPE), which
  changes the numbers, and the only such chunk here (the template's tail
  after the question) is a few tokens;
- attention: for a trained GGUF model (a catalogue name or a .gguf file)
  llama.cpp's own defaults (`cache_type="default"`: an f16 KV cache, flash
  attention `auto`), what a user of it gets; for a random preset converted
  for the comparison, f32 (`-ctk/-ctv f32`, `-fa off`), as our float32
  engine keeps it: llama.cpp's CPU flash attention rounds to f16 whatever
  the cache type, which moved a top-2 logit gap of the random 0.5B by ~0.1
  and flipped a near-tie (docs/peer.md, "the text mismatch"); `cache_type="f16"` asks for f16 explicitly;
- the same threads for prompt and decode as one of our replicas.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from headstart.peer.gguf_convert import PeerUnavailable, is_trained_gguf, model_gguf
from headstart.peer.llamacpp_server import LlamaCppServer, PeerProcess
from headstart.peer.server_build import find_llama_server

SERVER_CHOICES = ("auto", "cpp", "python")
CACHE_TYPES = ("auto", "default", "f32", "f16")


class LlamaServerCpp(PeerProcess):
    """One `llama-server` process with `parallel` slots serving `model` (a `random:<preset>` or a .gguf)."""

    kind = "cpp"

    def __init__(self, model: str, parallel: int = 1, port: int = 0, gguf_type: str = "f32", threads: int = 2,
                 ctx_per_slot: int = 2048, cache_type: str = "auto", seed: int = 0, binary: Path | None = None,
                 say=print):
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, not {parallel}")
        if cache_type not in CACHE_TYPES:
            raise ValueError(f"unknown KV cache type {cache_type!r}; valid: {', '.join(CACHE_TYPES)}")
        self.binary = binary or find_llama_server()
        if self.binary is None:
            raise PeerUnavailable("llama-server (C++) is not built: run `headstart peer build-server` "
                                  "(cmake and g++, many minutes on 2 cores)")
        if cache_type == "auto":
            cache_type = "default" if is_trained_gguf(model) else "f32"
        self.model, self.gguf_type, self.parallel = model, gguf_type, parallel
        self.ctx_per_slot, self.cache_type = ctx_per_slot, cache_type
        gguf = model_gguf(model, gguf_type, seed, say=say)
        super().__init__(gguf, port, threads, "llama-server", say=say)

    def describe(self) -> str:
        return f"llama-server (C++) -np {self.parallel}"

    def command(self) -> list[str]:
        t, n = str(self.threads), self.parallel
        return [str(self.binary), "--model", str(self.gguf), "--alias", "peer",
                "--host", "127.0.0.1", "--port", str(self.port), "--threads", t, "--threads-batch", t,
                "--parallel", str(n), "--ctx-size", str(n * self.ctx_per_slot), "--no-kv-unified",
                "--cont-batching", "--cache-prompt", "--cache-reuse", "0", "--no-webui"] + self.attention_flags()

    def attention_flags(self) -> list[str]:
        """The KV type and flash-attention flags (none: llama.cpp's own defaults)."""
        if self.cache_type == "default":
            return []
        return ["--cache-type-k", self.cache_type, "--cache-type-v", self.cache_type,
                "--flash-attn", "off" if self.cache_type == "f32" else "auto"]

    def ready(self) -> bool:
        # /health answers 503 while the model loads, 200 once slots take requests
        return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200

    def tokenize(self, text: str) -> list[int]:
        """The tokens a completion of prompt `text` evaluates (special tokens parsed, BOS as the model says)."""
        r = httpx.post(f"{self.url}/tokenize", json={"content": text, "add_special": True, "parse_special": True},
                       timeout=60.0)
        r.raise_for_status()
        return r.json()["tokens"]


def peer_server(model: str, server: str = "auto", parallel: int = 1, threads: int = 2, gguf_type: str = "f32",
                seed: int = 0, port: int = 0, cache_type: str = "auto", say=print) -> PeerProcess:
    """A (not yet started) peer server: the C++ `llama-server` with `parallel` slots when `server` is
    cpp, or auto and it is built; else llama-cpp-python's (one request at a time).

    Raises:
        ValueError: unknown `server`.
        PeerUnavailable: the server asked for (or, for auto, either) is not available.
    """
    if server not in SERVER_CHOICES:
        raise ValueError(f"--server must be one of {', '.join(SERVER_CHOICES)}, not {server!r}")
    if server == "cpp" or (server == "auto" and find_llama_server() is not None):
        return LlamaServerCpp(model, parallel=parallel, port=port, gguf_type=gguf_type, threads=threads,
                              cache_type=cache_type, seed=seed, say=say)
    try:
        return LlamaCppServer(model, port=port, gguf_type=gguf_type, threads=threads, seed=seed, say=say)
    except PeerUnavailable as exc:
        if server == "auto":
            raise PeerUnavailable(f"{exc}; or build llama.cpp's C++ server: headstart peer build-server") from exc
        raise
