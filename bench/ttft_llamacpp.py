"""`bench ttft`'s llamacpp mode: the same questions asked of llama.cpp, side by side.

llama.cpp does nothing while the user types (it has no typing API), so, like
`prefix`, the question is sent at Enter; llama.cpp reuses the longest cached
token prefix (the schema prompt, warmed once per database here as `prefix`
warms P0). The prompt is our rendered template as text, greedy, the same max
tokens. Also measured: one llama.cpp decode step on the same GGUF and threads,
in a process of its own, beside ours.
"""

from __future__ import annotations

from bench.peer_llamacpp import prompt_text, same_prompt_tokens
from headstart.peer.decode_step import run_in_subprocess
from headstart.peer.openai_stream import stream_completion

MODE = "llamacpp"


class LlamaCppTtft:
    """Runs the llamacpp mode of `bench ttft` against a started `LlamaCppServer`."""

    def __init__(self, server, runtime, dbs: list[str], say=print):
        self.server, self.runtime = server, runtime
        for db in dbs:  # the schema prompt cached before any clock starts, as prefix's P0 is
            timing = stream_completion(server.url, prompt_text(runtime.prompt_for(db), "warm up"), 1)
            if timing.error:
                raise RuntimeError(f"llama.cpp warm-up failed: {timing.error}")
        say(f"llamacpp: schema prompts of {len(dbs)} database(s) cached by llama.cpp")

    def run(self, db: str, question: str, max_new_tokens: int, cold_ids: list[int]) -> dict:
        """Ask `question` at Enter; the row `bench ttft` reports for mode llamacpp."""
        builder = self.runtime.prompt_for(db)
        ids = builder.prompt_ids(question)
        timing = stream_completion(self.server.url, prompt_text(builder, question), max_new_tokens)
        if timing.error:
            raise RuntimeError(f"llama.cpp completion failed: {timing.error}")
        return {
            "mode": MODE, "ttft_ms": timing.ttft_ms, "total_ms": timing.total_ms, "prompt_tokens": len(ids),
            "cached_tokens_at_submit": None, "computed_tokens_at_submit": None, "wasted_tokens": 0,
            "num_tokens": timing.chunks, "answer_tokens_ready_at_submit": 0,
            "same_prompt_tokens": same_prompt_tokens(self.server, builder, question),
            "identical_to_cold": timing.text == builder.decode(cold_ids),
        }

    def decode_step_ms(self, db: str, steps: int = 12) -> dict:
        """One llama.cpp decode step on a warm cache of the db's prompt (same prompt as ours)."""
        ids = self.runtime.prompt_for(db).prompt_ids("How many rows are there?")
        return run_in_subprocess(self.server.gguf, ids, self.server.threads, new_tokens=steps)
