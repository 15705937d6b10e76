"""Builders of `EngineEvent` messages, so the stream code reads as logic."""

from __future__ import annotations

from headstart.client.errors import code_of
from headstart.engine.requests.generation import SubmitResult
from headstart.eval.extract import extract_sql
from headstart.v1 import engine_pb2, types_pb2


def error(code: str, message: str, seq: int = 0) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(error=types_pb2.Error(code=code, message=message, seq=seq))


def from_exception(exc: BaseException, seq: int = 0) -> engine_pb2.EngineEvent:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return error(code_of(exc), message, seq)


def progress(seq: int, cached: int, prompt_tokens: int, schema_tokens: int = 0) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(progress=types_pb2.Progress(
        seq=seq, cached_tokens=cached, prompt_tokens=prompt_tokens, schema_tokens=schema_tokens))


def tokens(text: str, ids: list[int], logprobs: list[types_pb2.TokenLogprob] | None = None
           ) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(tokens=types_pb2.Tokens(text=text, token_ids=ids, logprobs=logprobs or []))


def token_logprob(lp, decode) -> types_pb2.TokenLogprob:
    """A `TokenLogprobs` on the wire, each token with its own text (`decode([id])`)."""
    return types_pb2.TokenLogprob(
        token_id=lp.token_id, token=decode([lp.token_id]), logprob=lp.logprob,
        top=[types_pb2.TopLogprob(token_id=t, token=decode([t]), logprob=v) for t, v in lp.top])


def result(res: SubmitResult, replica: str, seq: int, num_candidates: int = 0) -> engine_pb2.EngineEvent:
    """The Result of an answer; `num_candidates` > 1: a Choice follows it."""
    return engine_pb2.EngineEvent(result=types_pb2.Result(
        sql=extract_sql(res.text), text=res.text, token_ids=res.token_ids, ttft_ms=res.ttft_ms,
        total_ms=res.total_ms, prompt_tokens=res.prompt_tokens,
        cached_tokens_at_submit=res.cached_tokens_at_submit,
        computed_tokens_at_submit=res.computed_tokens_at_submit, wasted_tokens=res.wasted_tokens,
        finish_reason=res.finish_reason, replica=replica, seq=seq,
        answer_tokens_at_submit=int(res.extra.get("answer_tokens_ready_at_submit", 0)),
        num_candidates=num_candidates,
    ))


def attached(replica: str, rebuilt: bool) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(attached=engine_pb2.Attached(replica=replica, rebuilt=rebuilt))


def ack(seq: int, replica: str) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(ack=engine_pb2.Ack(seq=seq, replica=replica))
