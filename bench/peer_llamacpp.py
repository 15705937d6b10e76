"""llama.cpp as a peer in `bench ttft` and `bench serve` (optional: the `peer` extra).

`start_peer` returns a running peer server on the same random weights
(GGUF, f32 by default): llama.cpp's C++ `llama-server` with `parallel` slots
when it is built (`headstart peer build-server`), else llama-cpp-python's
server (one request at a time), or None with a printed note when neither is
available or mode `llamacpp` was turned off, so the benches still run
without them. `prompt_text` is our own rendered chat template: sent as a
`/v1/completions` prompt it tokenizes (by llama.cpp) to our prompt ids, which
`same_prompt_tokens` checks with the server's tokenizer.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from headstart.peer.gguf_convert import PeerUnavailable
from headstart.peer.openai_stream import stream_completion

LLAMACPP_CHOICES = ("auto", "on", "off")


def start_peer(model: str, llamacpp: str, threads: int | None, gguf_type: str = "f32", say=print,
               server: str = "auto", parallel: int = 1):
    """The running peer server, or None (with a note) when it is off or not available.

    `llamacpp`: "auto" runs it when a llama.cpp server is available, "on" requires
    it (PeerUnavailable otherwise), "off" never runs it. `server`: cpp, python or
    auto (cpp when built); `parallel`: the C++ server's slots.
    """
    if llamacpp not in LLAMACPP_CHOICES:
        raise ValueError(f"--llamacpp must be one of {', '.join(LLAMACPP_CHOICES)}, not {llamacpp!r}")
    if llamacpp == "off":
        return None
    from headstart.peer.llama_server_cpp import peer_server

    try:
        server = peer_server(model, server=server, parallel=parallel, threads=threads or default_threads(),
                             gguf_type=gguf_type, say=say)
    except PeerUnavailable as exc:
        if llamacpp == "on":
            raise
        say(f"note: llamacpp mode skipped: {exc}")
        return None
    return server.start()


def default_threads() -> int:
    """The threads torch uses here (our engine's default), so both engines get the same."""
    import torch

    return int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads()


def prompt_text(builder, question: str) -> str:
    """The full prompt for `question` as text: our rendered template, special tokens written out."""
    p = builder.parts
    decode = lambda ids: builder.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    return decode(p.head_special) + p.head_text + question + p.tail_text + decode(p.tail_special)


def same_prompt_tokens(server, builder, question: str) -> bool:
    """Whether llama.cpp tokenizes our prompt text to exactly our prompt ids."""
    return server.tokenize(prompt_text(builder, question)) == builder.prompt_ids(question)


def warm_slots(server, prompt: str) -> None:
    """Cache `prompt` (a schema prompt) in every slot before any clock starts, as our P0 is cached.

    llama-server: one request pinned to each slot, all at once (a slot reuses
    only what it holds itself, or what its RAM prompt cache kept); the
    llama-cpp-python server has one context: one request.
    """
    slots = list(range(server.parallel)) if server.kind == "cpp" else [None]
    with ThreadPoolExecutor(len(slots)) as pool:
        timings = list(pool.map(lambda slot: stream_completion(server.url, prompt, 1, slot=slot), slots))
    errors = [t.error for t in timings if t.error]
    if errors:
        raise RuntimeError(f"llama.cpp warm-up failed: {errors[0]}")
