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


def completion_body(prompt: str, max_tokens: int, model: str = "peer") -> dict:
    """The request body: greedy decoding, no penalties, streamed."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0,
            "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "stream": True}


def _consume(line: str, started: float, out: StreamTiming) -> bool:
    """Fold one SSE line into `out`; True at `data: [DONE]`."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        return True
    now = (time.perf_counter() - started) * 1000.0
    choice = json.loads(data)["choices"][0]
    if choice.get("text"):
        if out.ttft_ms is None:
            out.ttft_ms = now
        out.chunks += 1
        out.text += choice["text"]
        out.chunk_times_ms.append(now)
    out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return False


def stream_completion(url: str, prompt: str, max_tokens: int, timeout_s: float = 600.0) -> StreamTiming:
    """POST a streamed completion and time it (blocking)."""
    out = StreamTiming()
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=completion_body(prompt, max_tokens),
                      timeout=timeout_s) as response:
        if response.status_code != 200:
            out.error = f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:300]}"
            return out
        for line in response.iter_lines():
            if _consume(line, started, out):
                break
    out.total_ms = (time.perf_counter() - started) * 1000.0
    return out


async def astream_completion(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> StreamTiming:
    """POST a streamed completion and time it (asyncio; for many concurrent users)."""
    out = StreamTiming()
    started = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=completion_body(prompt, max_tokens)) as response:
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
