"""`bench serve`'s llamacpp rows: N typists asking llama.cpp, through its OpenAI API.

A llama.cpp user has no typing API, so each typist types in real time
sending nothing (as the prefix baseline does), then at Enter posts a streamed
`/v1/completions` with our rendered prompt text (same tokens; checked once
with the server's tokenizer) and the same max tokens. TTFT and total are
client-side (request → first token, request → `[DONE]`). llama-cpp-python's
server runs one request at a time, so at N > 1 requests queue there.
"""

from __future__ import annotations

import asyncio

import httpx

from bench.peer_llamacpp import prompt_text, same_prompt_tokens
from bench.serve_typists import Sample
from headstart.peer.openai_stream import astream_completion

MODE, PATH = "llamacpp", "openai"


def prompt_builder(db: str):
    """Our prompt builder for `db` (the replicas' tokenizer and schema), in the bench process."""
    from headstart.models import load_tokenizer
    from headstart.paths import default_tokenizer_dir
    from headstart.prompt import PromptBuilder
    from headstart.schema.resolve import resolve_database

    return PromptBuilder(load_tokenizer(default_tokenizer_dir()), resolve_database(db).schema)


def warm_up(server, builder, say=print) -> None:
    """Check llama.cpp sees our prompt tokens, and cache the schema prompt there (as P0 is cached)."""
    if not same_prompt_tokens(server, builder, "warm up"):
        say("warning: llama.cpp tokenizes our prompt text differently: its rows are not on the same tokens")
    asyncio.run(_warm(server, builder))
    say("llamacpp warm-up done")


async def _warm(server, builder) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        timing = await astream_completion(client, server.url, prompt_text(builder, "warm up"), 1)
    if timing.error:
        raise RuntimeError(f"llama.cpp warm-up failed: {timing.error}")


async def llamacpp_round(server, builder, n: int, questions: list[str], r: int, rounds: int, typist,
                         max_new: int) -> list[Sample]:
    """Round `r` of the llamacpp rows: the same questions as the other modes' round `r`."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n + 2)) as client:
        async def one(i: int) -> Sample:
            trace = typist.trace(questions[(i * rounds + r) % len(questions)])
            sample = Sample(PATH, False, trace.final_text)
            await asyncio.sleep(trace.submit_t)  # typing; nothing is sent
            timing = await astream_completion(client, server.url, prompt_text(builder, trace.final_text), max_new)
            sample.error = timing.error
            sample.ttft_ms, sample.total_ms = timing.ttft_ms, timing.total_ms
            sample.client_total_ms = timing.total_ms
            sample.prompt_tokens = len(builder.prompt_ids(trace.final_text))
            sample.computed_tokens_at_submit = None  # llama.cpp does not say how much of its cache it reused
            return sample

        return list(await asyncio.gather(*(one(i) for i in range(n))))
