from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Progress(_message.Message):
    __slots__ = ("seq", "cached_tokens", "prompt_tokens", "schema_tokens")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    cached_tokens: int
    prompt_tokens: int
    schema_tokens: int
    def __init__(self, seq: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., schema_tokens: _Optional[int] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("sql", "text", "token_ids", "ttft_ms", "total_ms", "prompt_tokens", "cached_tokens_at_submit", "computed_tokens_at_submit", "wasted_tokens", "finish_reason", "replica", "seq", "answer_tokens_at_submit", "num_candidates")
    SQL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_AT_SUBMIT_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_AT_SUBMIT_FIELD_NUMBER: _ClassVar[int]
    WASTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TOKENS_AT_SUBMIT_FIELD_NUMBER: _ClassVar[int]
    NUM_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    sql: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    cached_tokens_at_submit: int
    computed_tokens_at_submit: int
    wasted_tokens: int
    finish_reason: str
    replica: str
    seq: int
    answer_tokens_at_submit: int
    num_candidates: int
    def __init__(self, sql: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens_at_submit: _Optional[int] = ..., computed_tokens_at_submit: _Optional[int] = ..., wasted_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., replica: _Optional[str] = ..., seq: _Optional[int] = ..., answer_tokens_at_submit: _Optional[int] = ..., num_candidates: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "seq")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    seq: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "seed", "top_k", "min_new_tokens", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop", "logprobs", "top_logprobs")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    top_k: int
    min_new_tokens: int
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    logprobs: bool
    top_logprobs: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., top_k: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class CandidatesRequest(_message.Message):
    __slots__ = ("k", "temperature", "seed", "wait_all")
    K_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WAIT_ALL_FIELD_NUMBER: _ClassVar[int]
    k: int
    temperature: float
    seed: int
    wait_all: bool
    def __init__(self, k: _Optional[int] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., wait_all: _Optional[bool] = ...) -> None: ...

class FailedCandidate(_message.Message):
    __slots__ = ("index", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    error: str
    def __init__(self, index: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("seq", "index", "sql", "columns", "rows_json", "truncated", "agreed", "num_candidates", "failed", "error", "num_rows")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_JSON_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    NUM_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    index: int
    sql: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    rows_json: str
    truncated: bool
    agreed: int
    num_candidates: int
    failed: _containers.RepeatedCompositeFieldContainer[FailedCandidate]
    error: str
    num_rows: int
    def __init__(self, seq: _Optional[int] = ..., index: _Optional[int] = ..., sql: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., rows_json: _Optional[str] = ..., truncated: _Optional[bool] = ..., agreed: _Optional[int] = ..., num_candidates: _Optional[int] = ..., failed: _Optional[_Iterable[_Union[FailedCandidate, _Mapping]]] = ..., error: _Optional[str] = ..., num_rows: _Optional[int] = ...) -> None: ...
