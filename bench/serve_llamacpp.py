"""`bench serve`'s llamacpp rows: N typists asking llama.cpp, through its OpenAI API.

A llama.cpp user has no typing API, so each typist types in real time
sending nothing (as the prefix baseline does), then at Enter posts a streamed
`/v1/completions` with our rendered prompt text (same tokens; checked once
with the server's tokenizer) and the same max tokens. TTFT and total are
client-side (request → first token, request → `[DONE]`).

The server: llama.cpp's C++ `llama-server` when built, restarted at each N
with `-np N` slots (continuous batching; every slot warmed with the schema
prompt, as our P0 is cached), so N users decode together as they would on
a llama.cpp deployment sized for N; else llama-cpp-python's server, which
runs one request at a time (at N > 1 requests queue there). llama-server
reports the prompt tokens it reused, so its computed@submit is known.
"""

from __future__ import annotations

import asyncio

import httpx

from bench.peer_llamacpp import prompt_text, same_prompt_tokens, warm_slots
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
    """Check llama.cpp sees our prompt tokens, and cache the schema prompt in every slot (as P0 is cached)."""
    if not same_prompt_tokens(server, builder, "warm up"):
        say("warning: llama.cpp tokenizes our prompt text differently: its rows are not on the same tokens")
    warm_slots(server, prompt_text(builder, "warm up"))
    say(f"llamacpp warm-up done ({server.describe()})")


class PeerRows:
    """The server the llamacpp rows ask at each N: llama-server restarted with `-np N` (warmed), or
    the one llama-cpp-python server for every N."""

    def __init__(self, server, builder, say=print):
        self.server, self.builder, self.say = server, builder, say
        self._warm = False

    def at(self, n: int):
        """The started, warmed server for N concurrent users."""
        if self.server.kind == "cpp" and self.server.parallel != n:
            from headstart.peer.llama_server_cpp import LlamaServerCpp

            old = self.server
            old.stop()
            self.server = LlamaServerCpp(str(old.gguf), parallel=n, threads=old.threads, ctx_per_slot=old.ctx_per_slot,
                                         cache_type=old.cache_type, binary=old.binary, say=self.say)
            self.server.start()
            self._warm = False
        if not self._warm:
            warm_up(self.server, self.builder, self.say)
            self._warm = True
        return self.server

    def stop(self) -> None:
        self.server.stop()


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
            # llama-server says how much of the prompt it reused; llama-cpp-python does not (None)
            sample.computed_tokens_at_submit = timing.computed_prompt_tokens
            return sample

        return list(await asyncio.gather(*(one(i) for i in range(n))))
