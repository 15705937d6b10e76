"""The generation parameters of an OpenAI request: read, checked, or refused by name.

Every request field is one of:

- honoured: `temperature`, `top_p`, `top_k`, `seed`, `n`, `stop`,
  `presence_penalty`, `frequency_penalty`, `repetition_penalty`,
  `ignore_eos`, `min_tokens`, `logprobs`, `top_logprobs` (plus the routing fields `model`, `database`,
  `session`, the text, the length and streaming fields, read elsewhere);
- refused unless it holds its neutral value (`REFUSED`): a 400
  `unsupported_parameter` naming it, so a client never gets an answer other
  than the one it asked for without being told;
- harmless (`HARMLESS`): no effect on what is generated (`user`, `metadata`, ...);
- unknown: not read; the names go back in the response header
  `x-headstart-ignored-params` so that a client can see what was not read.

Defaults that differ from OpenAI's: an omitted `temperature` is 0 (greedy:
the SQL a user gets is the model's most likely one, and exactness is
defined for it); an omitted `seed` with sampling is a fresh random seed per
request (OpenAI's behaviour; choice i of `n` uses seed + i).
"""

from __future__ import annotations

import secrets

from headstart.v1 import types_pb2
from services.gateway.openai_errors import bad_param, unsupported_param

SEED_RANGE = 2**63
MAX_STOP = 4
MAX_STOP_CHARS = 64

# name -> (neutral values, why it is refused otherwise)
REFUSED: dict[str, tuple[tuple, str]] = {
    "prompt_logprobs": ((None, 0), "the prompt's log-probabilities are not computed (its cache was built ahead)"),
    "echo": ((None, False), "the prompt is the database's, not echoed"),
    "suffix": ((None, ""), "no fill-in-the-middle"),
    "best_of": ((None, 1), "use n"),
    "logit_bias": ((None, {}), "logits are not biased"),
    "tools": ((None, []), "no tool calls"),
    "tool_choice": ((None, "none"), "no tool calls"),
    "functions": ((None, []), "no tool calls"),
    "function_call": ((None, "none"), "no tool calls"),
    "response_format": ((None, {"type": "text"}), "the answer is SQL text"),
    "guided_json": ((None,), "no guided decoding"),
    "guided_regex": ((None,), "no guided decoding"),
    "guided_choice": ((None,), "no guided decoding"),
    "guided_grammar": ((None,), "no guided decoding"),
    "structured_outputs": ((None,), "no guided decoding"),
    "min_p": ((None, 0, 0.0), "min_p sampling is not implemented"),
    "stop_token_ids": ((None, []), "use stop (strings)"),
    "bad_words": ((None, []), "no banned words"),
    "allowed_token_ids": ((None, []), "no token restriction"),
    "include_stop_str_in_output": ((None, False), "the stop string is never returned"),
    "skip_special_tokens": ((None, True), "special tokens are never returned"),
    "use_beam_search": ((None, False), "no beam search"),
    "length_penalty": ((None, 1, 1.0), "no beam search"),
    "truncate_prompt_tokens": ((None,), "a prompt is never truncated"),
    "echo_prompt": ((None, False), "the prompt is the database's"),
    "add_generation_prompt": ((None, True), "the assistant turn is always opened"),
    "continue_final_message": ((None, False), "the assistant turn is always opened"),
    "chat_template": ((None,), "the model's own template is used"),
    "audio": ((None,), "text only"),
    "modalities": ((None, ["text"]), "text only"),
    "prediction": ((None,), "no predicted outputs"),
    "reasoning_effort": ((None,), "not a reasoning model"),
}
# Fields that change nothing about the answer.
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "request_id",
                      "priority", "cache_salt"})
# Fields read by the request parser (openai_schema.py) and here.
READ = frozenset({"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "stream_options",
                  "database", "session", "temperature", "top_p", "top_k", "seed", "n", "stop", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens", "logprobs",
                  "top_logprobs", "candidates"})
MAX_TOP_LOGPROBS = 20  # chat (OpenAI's bound)
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' `logprobs` (OpenAI's bound)


def check_refused(data: dict) -> None:
    """Raise 400 naming the first refused parameter that is not neutral."""
    for name, (neutral, why) in REFUSED.items():
        if name in data and data[name] not in neutral:
            raise unsupported_param(name, why)


def ignored_fields(data: dict) -> list[str]:
    """Request fields nobody read (neither honoured, refused nor harmless)."""
    return sorted(k for k in data if k not in READ and k not in REFUSED and k not in HARMLESS)


def _number(data: dict, name: str, low: float, high: float, *, open_low: bool = False) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
            (low < value if open_low else low <= value) and value <= high):
        raise bad_param(name, f"{name} must be a number in {'(' if open_low else '['}{low:g}, {high:g}]")
    return float(value)


def _integer(data: dict, name: str, low: int, high: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise bad_param(name, f"{name} must be an integer in [{low}, {high}]")
    return value


def _bool(data: dict, name: str) -> bool:
    value = data.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_param(name, f"{name} must be a boolean")
    return value


def stop_strings(value: object) -> list[str]:
    """`stop`: null, a string, or a list of up to 4 non-empty strings (each at most 64 characters)."""
    if value is None:
        return []
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings) \
            or len(strings) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in strings):
        raise bad_param("stop", f"stop must be a string or a list of at most {MAX_STOP} non-empty strings "
                                f"of at most {MAX_STOP_CHARS} characters")
    return list(dict.fromkeys(strings))


def logprob_request(data: dict, chat: bool) -> tuple[bool, int]:
    """(log-probabilities wanted, how many top tokens): chat's `logprobs` (a boolean) and
    `top_logprobs` (0..20, with logprobs); /v1/completions' `logprobs` (0..5 top tokens, null: none)."""
    if chat:
        wanted = _bool(data, "logprobs")
        top = _integer(data, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
        if top and not wanted:
            raise bad_param("top_logprobs", "top_logprobs needs logprobs: true")
        return wanted, top
    if data.get("top_logprobs") not in (None, 0):
        raise bad_param("top_logprobs", "/v1/completions takes the top count in logprobs (0..5)")
    top = _integer(data, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    return top is not None, top or 0


def sampling(data: dict, max_tokens: int | None, chat: bool = True) -> tuple[types_pb2.SamplingParams, bool]:
    """The engine's sampling parameters of a request (max_new_tokens left 0:
    the gateway sets it), and whether its seed was the client's."""
    values: dict = {}
    wanted, top = logprob_request(data, chat)
    if wanted:
        values.update(logprobs=True, top_logprobs=top)
    temperature = _number(data, "temperature", 0.0, 2.0)
    if temperature is not None:
        values["temperature"] = temperature
    top_p = _number(data, "top_p", 0.0, 1.0, open_low=True)
    if top_p is not None:
        values["top_p"] = top_p
    top_k = _integer(data, "top_k", -1, 1 << 20)
    if top_k is not None and top_k > 0:  # vLLM: -1 (and 0) mean all tokens
        values["top_k"] = top_k
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(data, name, -2.0, 2.0)
        if value:
            values[name] = value
    repetition = _number(data, "repetition_penalty", 0.0, 10.0, open_low=True)
    if repetition is not None and repetition != 1.0:
        values["repetition_penalty"] = repetition
    min_tokens = _integer(data, "min_tokens", 0, 1 << 20)
    if min_tokens:
        if max_tokens is not None and min_tokens > max_tokens:
            raise bad_param("min_tokens", "min_tokens must not exceed max_tokens")
        values["min_new_tokens"] = min_tokens
    if _bool(data, "ignore_eos"):
        values["ignore_eos"] = True
    stop = stop_strings(data.get("stop"))
    seed = _integer(data, "seed", -SEED_RANGE, SEED_RANGE - 1)
    seeded = seed is not None
    if seed is None and values.get("temperature", 0.0) > 0:
        seed = secrets.randbelow(SEED_RANGE)  # OpenAI: no seed, a different sample each time
    if seed is not None:
        values["seed"] = seed
    return types_pb2.SamplingParams(stop=stop, **values), seeded


def choice_count(data: dict, max_n: int) -> int:
    """`n`: 1..max_n choices."""
    n = data.get("n")
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= max_n:
        raise bad_param("n", f"n must be an integer in [1, {max_n}] (the gateway's openai_max_n)")
    return n


def for_choice(params: types_pb2.SamplingParams, index: int) -> types_pb2.SamplingParams:
    """Choice `index` of n: the same parameters, seed + index (distinct samples, reproducible with a seed)."""
    if index == 0:
        return params
    out = types_pb2.SamplingParams()
    out.CopyFrom(params)
    out.seed = (params.seed + index + SEED_RANGE) % (2 * SEED_RANGE) - SEED_RANGE
    return out
