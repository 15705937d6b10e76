"""Start and stream a `GenerationRequest` as EngineEvents without blocking the event loop.

Starting one may block (a cold prompt's P0 is prefilled first), so it runs
on a thread (`start_cancellable`); a caller cancelled meanwhile (the client
left in its first moments) cancels the request as soon as it exists, which
would otherwise run to its end unread (issue 29: 510 of 510 decode steps).
The request's token iterator blocks too, so a daemon thread drains it and
posts events to an asyncio queue with `call_soon_threadsafe` (never
blocking the forward worker). Cancelling the consumer cancels the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Callable

from headstart.engine.requests.generation import GenerationRequest
from headstart.v1 import engine_pb2
from services.engine import events
from services.engine.detok import TextDeltas

_END = object()


def _pump(request: GenerationRequest, decode: Callable[[list[int]], str], replica: str, seq: int,
          post: Callable[[object], None]) -> None:
    holdback = max((len(s) for s in request.params.stop), default=1) - 1
    deltas = TextDeltas(decode, holdback)
    try:
        for i, token_id in enumerate(request.stream()):
            text = deltas.push(token_id)
            lp = request.logprobs[i] if request.params.logprobs and i < len(request.logprobs) else None
            post(events.tokens(text, [token_id], [events.token_logprob(lp, decode)] if lp is not None else None))
        result = request.result()
        tail = deltas.flush(result.text)
        if tail:
            post(events.tokens(tail, []))
        cset = request.candidates
        post(events.result(result, replica, seq, cset.params.k if cset is not None else 0))
    except BaseException as exc:  # the request's error (Cancelled, PromptTooLong, ...)
        post(events.from_exception(exc, seq))
    finally:
        post(_END)


async def start_cancellable(start: Callable[[], GenerationRequest]) -> GenerationRequest:
    """`start()` (it queues a request) on a thread; if the caller is cancelled before it returns,
    the request it queued is cancelled the moment it exists."""
    future = asyncio.ensure_future(asyncio.to_thread(start))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_cancel_started)
        raise


def _cancel_started(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()


async def generation_events(request: GenerationRequest, decode: Callable[[list[int]], str],
                            replica: str, seq: int) -> AsyncIterator[engine_pb2.EngineEvent]:
    """Tokens events as generated, then one Result (or one Error)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def post(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (replica shutting down): nobody to tell
            pass

    threading.Thread(target=_pump, args=(request, decode, replica, seq, post), daemon=True,
                     name="headstart-gen-pump").start()
    try:
        while (item := await queue.get()) is not _END:
            yield item
    finally:
        # stops the work when the consumer went away; a finished request's candidates go on
        # (their check awaits them: services/engine/checks.py)
        if not request.done.is_set():
            request.cancel()
