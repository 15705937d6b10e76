"""llama.cpp as a peer in `bench ttft` and `bench serve` (optional: the `peer` extra).

`start_peer` returns a running `LlamaCppServer` on the same random weights
(GGUF, f32 by default), or None with a printed note when llama-cpp-python is
not installed or mode `llamacpp` was turned off, so the benches still run
without the extra. `prompt_text` is our own rendered chat template: sent as a
`/v1/completions` prompt it tokenizes (by llama.cpp) to our prompt ids, which
`same_prompt_tokens` checks with the server's tokenizer.
"""

from __future__ import annotations

import os

from headstart.peer.gguf_convert import PeerUnavailable

LLAMACPP_CHOICES = ("auto", "on", "off")


def start_peer(model: str, llamacpp: str, threads: int | None, gguf_type: str = "f32", say=print):
    """The running peer server, or None (with a note) when it is off or not installed.

    `llamacpp`: "auto" runs it when llama-cpp-python is installed, "on" requires
    it (PeerUnavailable otherwise), "off" never runs it.
    """
    if llamacpp not in LLAMACPP_CHOICES:
        raise ValueError(f"--llamacpp must be one of {', '.join(LLAMACPP_CHOICES)}, not {llamacpp!r}")
    if llamacpp == "off":
        return None
    from headstart.peer.llamacpp_server import LlamaCppServer

    try:
        server = LlamaCppServer(model, gguf_type=gguf_type, threads=threads or default_threads(), say=say)
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
