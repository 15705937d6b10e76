"""`bench ttft`'s llamacpp mode: the same questions asked of llama.cpp, side by side.

llama.cpp does nothing while the user types (it has no typing API), so, like
`prefix`, the question is sent at Enter; llama.cpp reuses the longest cached
token prefix (the schema prompt, warmed once per database here as `prefix`
warms P0; with more databases than slots its RAM prompt cache holds the
others). The prompt is our rendered template as text, greedy, the same max
tokens. llama-server reports the prompt tokens it took from its cache, so
its computed@submit is known. Also measured: one llama.cpp decode step on
the same GGUF and threads (in a process of its own with llama-cpp-python;
llama-server's own per-token decode time otherwise), beside ours.
"""

from __future__ import annotations

import importlib.util
import statistics

from bench.peer_llamacpp import prompt_text, same_prompt_tokens, warm_slots
from headstart.peer.openai_stream import stream_completion

MODE = "llamacpp"


class LlamaCppTtft:
    """Runs the llamacpp mode of `bench ttft` against a started peer server."""

    def __init__(self, server, runtime, dbs: list[str], say=print):
        self.server, self.runtime = server, runtime
        self.server_decode_ms: list[float] = []
        for db in dbs:  # the schema prompt cached before any clock starts, as prefix's P0 is
            warm_slots(server, prompt_text(runtime.prompt_for(db), "warm up"))
        say(f"llamacpp ({server.describe()}): schema prompts of {len(dbs)} database(s) cached")

    def run(self, db: str, question: str, max_new_tokens: int, cold_ids: list[int]) -> dict:
        """Ask `question` at Enter; the row `bench ttft` reports for mode llamacpp."""
        builder = self.runtime.prompt_for(db)
        ids = builder.prompt_ids(question)
        timing = stream_completion(self.server.url, prompt_text(builder, question), max_new_tokens)
        if timing.error:
            raise RuntimeError(f"llama.cpp completion failed: {timing.error}")
        if timing.server_timings.get("predicted_per_token_ms"):
            self.server_decode_ms.append(timing.server_timings["predicted_per_token_ms"])
        computed = timing.computed_prompt_tokens
        return {
            "mode": MODE, "ttft_ms": timing.ttft_ms, "total_ms": timing.total_ms, "prompt_tokens": len(ids),
            "cached_tokens_at_submit": timing.cached_tokens, "computed_tokens_at_submit": computed,
            "wasted_tokens": 0, "num_tokens": timing.chunks, "answer_tokens_ready_at_submit": 0,
            "same_prompt_tokens": same_prompt_tokens(self.server, builder, question),
            "identical_to_cold": timing.text == builder.decode(cold_ids), "answer_text": timing.text,
            "cold_answer_text": builder.decode(cold_ids), "server": self.server.describe(),
        }

    def decode_step_ms(self, db: str, steps: int = 12) -> dict | None:
        """One llama.cpp decode step on a warm cache of the db's prompt (same prompt as ours), measured
        in-process with llama-cpp-python; None when it is not installed (llama-server's own per-token
        time, `server_decode_step_ms`, stands in then)."""
        if importlib.util.find_spec("llama_cpp") is None:
            return None
        from headstart.peer.decode_step import run_in_subprocess

        ids = self.runtime.prompt_for(db).prompt_ids("How many rows are there?")
        return run_in_subprocess(self.server.gguf, ids, self.server.threads, new_tokens=steps)

    def server_decode_step_ms(self) -> float | None:
        """Median of llama-server's own decode ms per token over the questions asked (None: not reported)."""
        return statistics.median(self.server_decode_ms) if self.server_decode_ms else None
