"""Timed streaming completions against an OpenAI-compatible server.

The prompt is the text of our own rendered chat template (system, schema,
question, assistant turn opened), sent to `/v1/completions`, so the peer
sees the same tokens we prefill (checked with its tokenizer by the callers).
Greedy (temperature 0, no repeat penalty) and the same max tokens as ours.
TTFT is measured at the client: request sent → first streamed token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamTiming:
    """One streamed completion: client TTFT, time to the last token, what came back."""

    ttft_ms: float | None = None
    total_ms: float | None = None
    chunks: int = 0
    text: str = ""
    finish_reason: str | None = None
    chunk_times_ms: list[float] = field(default_factory=list)
    error: str = ""
    # From the final chunk's `usage`, when the server sends it (llama-server does; prompt_tokens_details
    # .cached_tokens = the prefix its slot or prompt cache already held): None when not said.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # llama-server's own `timings` of the request (prompt_ms, predicted_per_token_ms, ...), when sent
    server_timings: dict = field(default_factory=dict)

    @property
    def computed_prompt_tokens(self) -> int | None:
        """Prompt tokens the server evaluated for this request (not taken from its cache)."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens


def completion_body(prompt: str, max_tokens: int, model: str = "peer", slot: int | None = None) -> dict:
    """The request body: greedy decoding, no penalties, streamed, the prompt cache on.

    `cache_prompt` (llama-server: reuse the slot's longest common prefix; on by
    default, said anyway) and `id_slot` (pin the request to one slot, for
    warming every slot) are llama-server fields; llama-cpp-python ignores them.
    """
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0,
            "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "stream": True,
            "cache_prompt": True}
    if slot is not None:
        body["id_slot"] = slot
    return body


def _consume(line: str, started: float, out: StreamTiming) -> bool:
    """Fold one SSE line into `out`; True at `data: [DONE]`."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        return True
    now = (time.perf_counter() - started) * 1000.0
    chunk = json.loads(data)
    usage = chunk.get("usage") or {}
    if "prompt_tokens" in usage:
        out.prompt_tokens = usage["prompt_tokens"]
        out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if isinstance(chunk.get("timings"), dict):
        out.server_timings = chunk["timings"]
    if not chunk.get("choices"):
        return False
    choice = chunk["choices"][0]
    if choice.get("text"):
        if out.ttft_ms is None:
            out.ttft_ms = now
        out.chunks += 1
        out.text += choice["text"]
        out.chunk_times_ms.append(now)
    out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return False


def stream_completion(url: str, prompt: str, max_tokens: int, timeout_s: float = 600.0,
                      slot: int | None = None) -> StreamTiming:
    """POST a streamed completion and time it (blocking)."""
    out = StreamTiming()
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=completion_body(prompt, max_tokens, slot=slot),
                      timeout=timeout_s) as response:
        if response.status_code != 200:
            out.error = f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:300]}"
            return out
        for line in response.iter_lines():
            if _consume(line, started, out):
                break
    out.total_ms = (time.perf_counter() - started) * 1000.0
    return out


async def astream_completion(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                             slot: int | None = None) -> StreamTiming:
    """POST a streamed completion and time it (asyncio; for many concurrent users)."""
    out = StreamTiming()
    started = time.perf_counter()
    body = completion_body(prompt, max_tokens, slot=slot)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
                return out
            async for line in response.aiter_lines():
                if _consume(line, started, out):
                    break
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.total_ms = (time.perf_counter() - started) * 1000.0
    return out
