"""Running an OpenAI call on the engine: its events as `(choice index, EngineEvent)`.

- Without a session, each of the `n` choices is one engine `Complete` in
  `prefix` mode, run at once: every choice starts from the database's warm
  prompt cache (P0, read in place by the replica, not copied) and computes
  only the question; choice i samples with seed + i. Each takes one of the
  tenant's completion slots (`completes_per_tenant`).
- With a session (`session` field), the one choice is a submit on that
  typing session (`GatewayService.answer_on_session`): the answer comes
  from the session's cache.

An engine `Error` event, or a refusal, is raised as `OpenAIError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2, types_pb2
from services.gateway.openai_errors import OpenAIError
from services.gateway.openai_params import for_choice
from services.gateway.openai_schema import CompletionCall, Target
from services.gateway.service import GatewayService

ChoiceEvent = tuple[int, engine_pb2.EngineEvent]
_DONE = object()


async def choice_events(service: GatewayService, tenant: str, call: CompletionCall,
                        target: Target) -> AsyncIterator[ChoiceEvent]:
    """Tokens and results of every choice, interleaved as they come; each choice ends with its Result."""
    if target.session is not None:
        events = service.answer_on_session(tenant, target.session, call.question, call.max_tokens, call.sampling,
                                           call.candidates)
        async with contextlib.aclosing(_checked(events)) as checked:
            async for event in checked:
                yield 0, event
        return
    if call.n == 1:  # no task, no queue: the common case stays a plain stream
        async with contextlib.aclosing(_checked(_complete(service, tenant, call, target, 0))) as checked:
            async for event in checked:
                yield 0, event
        return
    async for item in _merged(service, tenant, call, target):
        yield item


def _complete(service: GatewayService, tenant: str, call: CompletionCall, target: Target,
              index: int) -> AsyncIterator[engine_pb2.EngineEvent]:
    return service.complete(tenant, target.db, call.question, call.max_tokens, "prefix", None,
                            sampling=for_choice(call.sampling, index), candidates=_candidates(call))


def _candidates(call: CompletionCall) -> types_pb2.CandidatesRequest | None:
    """The call's candidates; with n > 1, none (k 1): n choices are n answers, not one checked one."""
    return call.candidates if call.n == 1 else types_pb2.CandidatesRequest(k=1)


async def _checked(events: AsyncIterator[engine_pb2.EngineEvent]) -> AsyncIterator[engine_pb2.EngineEvent]:
    """`events` with an engine Error event or an ApiError raised as OpenAIError."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if event.WhichOneof("kind") == "error":
                    raise OpenAIError.from_api(ApiError(event.error.code, event.error.message))
                yield event
    except ApiError as exc:
        raise OpenAIError.from_api(exc) from exc


async def _merged(service: GatewayService, tenant: str, call: CompletionCall,
                  target: Target) -> AsyncIterator[ChoiceEvent]:
    """n Completes at once; their events as they arrive. The first failure
    ends them all (the client gets one error, not a partial set of choices)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def run(index: int) -> None:
        try:
            async for event in _checked(_complete(service, tenant, call, target, index)):
                queue.put_nowait((index, event))
            queue.put_nowait((index, _DONE))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 (handed to the reader, which raises it)
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(run(i)) for i in range(call.n)]
    try:
        running = call.n
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
