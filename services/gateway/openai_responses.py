"""OpenAI response objects built from engine results: whole responses, stream chunks, usage.

With `n` choices the prompt is counted once (OpenAI's usage) and the
completion tokens of every choice are added; `cached_tokens` and the
`headstart` extension (SQL, timings, tokens computed at submit) are the
first choice's. Log-probabilities (when asked) come in OpenAI's two shapes:
chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` and the text
API's `{tokens, token_logprobs, top_logprobs, text_offset}`.
"""

from __future__ import annotations

import time
import uuid

from headstart.v1 import types_pb2
from services.gateway.openai_schema import CompletionCall


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(results: list[types_pb2.Result]) -> dict:
    """Prompt (once), cached and completion tokens (all choices) of engine results: OpenAI's `usage`."""
    first = results[0]
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens_at_submit}}


def headstart_extra(result: types_pb2.Result) -> dict:
    """What an OpenAI client ignores and a headstart client may read: the SQL and timings."""
    return {"sql": result.sql, "ttft_ms": result.ttft_ms, "total_ms": result.total_ms,
            "computed_tokens_at_submit": result.computed_tokens_at_submit,
            "answer_tokens_at_submit": result.answer_tokens_at_submit}


def logprobs_body(chat: bool, entries: list[types_pb2.TokenLogprob], offset: int = 0) -> dict:
    """Log-probabilities of `entries` (the text API's offsets count from `offset`)."""
    if chat:
        return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode()),
                             "top_logprobs": [{"token": t.token, "logprob": t.logprob,
                                               "bytes": list(t.token.encode())} for t in e.top]}
                            for e in entries]}
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries], "text_offset": offsets}


def _choice(index: int, chat: bool, result: types_pb2.Result, logprobs: list | None) -> dict:
    choice = {"index": index, "finish_reason": result.finish_reason or "stop",
              "logprobs": None if logprobs is None else logprobs_body(chat, logprobs)}
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    return choice


def full_response(call: CompletionCall, chat: bool, results: list[types_pb2.Result], response_id: str,
                  logprobs: list[list] | None = None) -> dict:
    """The whole answer: one choice per result, in index order (`logprobs`: each choice's entries)."""
    return {"id": response_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": call.model,
            "choices": [_choice(i, chat, r, None if logprobs is None else logprobs[i]) for i, r in enumerate(results)],
            "usage": usage(results),
            "headstart": headstart_extra(results[0])}


def chunk(response_id: str, call: CompletionCall, chat: bool, index: int = 0, *, text: str | None = None,
          role: bool = False, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
    """One streamed chunk of choice `index`: a piece of text (with its tokens' `logprobs`
    body), the opening role, or the finish."""
    choice: dict = {"index": index, "finish_reason": finish_reason, "logprobs": logprobs}
    if chat:
        delta: dict = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return _chunk_body(response_id, call, chat) | {"choices": [choice]}


def usage_chunk(response_id: str, call: CompletionCall, chat: bool, results: list[types_pb2.Result]) -> dict:
    """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
    return _chunk_body(response_id, call, chat) | {"choices": [], "usage": usage(results),
                                                   "headstart": headstart_extra(results[0])}


def _chunk_body(response_id: str, call: CompletionCall, chat: bool) -> dict:
    return {"id": response_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": call.model}
