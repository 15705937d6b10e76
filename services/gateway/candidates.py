"""Execution-checked answers at the gateway's edges: the `candidates` a client asks, the `choice` it gets.

A client asks for candidates on a submit or completion (`candidates`: a
count, or `{"k", "temperature", "seed", "wait_all"}` in JSON; a
`CandidatesRequest` on gRPC). The replica decodes them, streams the greedy
answer as always, checks the candidates' SQL on the request's database and
sends a `Choice` after the Result (services/engine/checks.py). The SQL runs
with this gateway's Run limits (`check_limits`: /v1/execute's deadline,
rows and cell length), so the rows a choice carries are the rows a Run
click would show.
"""

from __future__ import annotations

import json
import math

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2, types_pb2

MAX_TEMPERATURE = 2.0  # as the other sampling edges take it
# the engine's bound (headstart.engine.requests.candidates.MAX_CANDIDATES; not imported: the gateway
# loads no engine code); a gateway's `max_candidates` is at most this
ENGINE_MAX_CANDIDATES = 16
FIELDS = ("k", "temperature", "seed", "wait_all")


def _bad(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_greedy(params: types_pb2.SamplingParams) -> bool:
    """Plain greedy decoding (the engine's `SamplingParams.plain_greedy`): the one a candidate set's
    answer 0 is (the sampled candidates sample with the candidates' own temperature)."""
    return (params.temperature == 0 and not params.presence_penalty and not params.frequency_penalty
            and params.repetition_penalty in (0.0, 1.0) and not params.min_new_tokens and not params.ignore_eos
            and not params.logprobs)


def checked_candidates(wire: types_pb2.CandidatesRequest, max_k: int,
                       params: types_pb2.SamplingParams | None = None) -> types_pb2.CandidatesRequest:
    """`wire` when its values are in range (k 0: the server's default), else INVALID_ARGUMENT naming
    the value. k > 1 needs greedy `params` (the answer's own sampling): else nothing would be checked."""
    if params is not None and wire.k > 1 and not is_greedy(params):
        raise _bad("candidates need greedy decoding of the answer (temperature 0, no penalties, no logprobs): "
                   "the sampled candidates take the candidates' own temperature")
    if wire.k < 0 or wire.k > max_k:
        raise _bad(f"candidates must be between 1 and {max_k} (0 or unset: the server's default), not {wire.k}")
    if wire.HasField("temperature"):
        t = wire.temperature
        if not math.isfinite(t) or not 0.0 < t <= MAX_TEMPERATURE:
            raise _bad(f"candidates temperature must be a number in (0, {MAX_TEMPERATURE:g}], not {t!r}")
    if wire.seed < 0:
        raise _bad(f"candidates seed must be >= 0, not {wire.seed}")
    return wire


def candidates_from_json(value: object, max_k: int) -> types_pb2.CandidatesRequest | None:
    """A JSON body's `candidates`: null (the server's default), a count k >= 1, or an object
    `{"k", "temperature", "seed", "wait_all"}` (k required). INVALID_ARGUMENT for anything else."""
    if value is None:
        return None
    if _integer(value):
        value = {"k": value}
    if not isinstance(value, dict):
        raise _bad('candidates must be a count or an object {"k", "temperature", "seed", "wait_all"}')
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise _bad(f"unknown candidates field(s) {', '.join(unknown)}; valid: {', '.join(FIELDS)}")
    k = value.get("k")
    if not _integer(k) or not 1 <= k <= max_k:
        raise _bad(f"candidates k must be an integer between 1 and {max_k}, not {k!r}")
    wire = types_pb2.CandidatesRequest(k=k)
    temperature = value.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise _bad(f"candidates temperature must be a number in (0, {MAX_TEMPERATURE:g}], not {temperature!r}")
        wire.temperature = float(temperature)
    seed = value.get("seed", 0)
    if not _integer(seed) or not 0 <= seed < 2**63:
        raise _bad(f"candidates seed must be an integer >= 0, not {seed!r}")
    wire.seed = seed
    wait_all = value.get("wait_all", False)
    if not isinstance(wait_all, bool):
        raise _bad(f"candidates wait_all must be a boolean, not {wait_all!r}")
    wire.wait_all = wait_all
    return checked_candidates(wire, max_k)


def check_limits(settings) -> engine_pb2.CheckLimits:
    """The Run limits of this gateway's /v1/execute, for the candidates' SQL (`GatewaySettings`)."""
    return engine_pb2.CheckLimits(timeout_s=settings.execute_timeout_s, rows=settings.execute_row_limit,
                                  cell_chars=settings.execute_cell_bytes)


def choice_json(choice: types_pb2.Choice) -> dict:
    """A `Choice` as JSON (the WebSocket's `choice` message, REST's and OpenAI's `choice` field):
    the rows as /v1/execute returns them (`columns`, `rows`, `truncated`)."""
    return {"seq": choice.seq, "index": choice.index, "sql": choice.sql, "columns": list(choice.columns),
            "rows": json.loads(choice.rows_json or "[]"), "truncated": choice.truncated,
            "num_rows": choice.num_rows, "agreed": choice.agreed, "num_candidates": choice.num_candidates,
            "failed": [{"index": f.index, "error": f.error} for f in choice.failed],
            "error": choice.error or None}
