from headstart.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineRequest(_message.Message):
    __slots__ = ("attach", "snapshot", "submit", "cancel")
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    attach: Attach
    snapshot: Snapshot
    submit: EngineSubmit
    cancel: CancelGeneration
    def __init__(self, attach: _Optional[_Union[Attach, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., submit: _Optional[_Union[EngineSubmit, _Mapping]] = ..., cancel: _Optional[_Union[CancelGeneration, _Mapping]] = ...) -> None: ...

class Attach(_message.Message):
    __slots__ = ("session_id", "db", "policy", "seq", "text", "candidates")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    policy: str
    seq: int
    text: str
    candidates: _types_pb2.CandidatesRequest
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., policy: _Optional[str] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("seq", "text")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class EngineSubmit(_message.Message):
    __slots__ = ("seq", "text", "params", "candidates", "check_limits")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    CHECK_LIMITS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    params: _types_pb2.SamplingParams
    candidates: _types_pb2.CandidatesRequest
    check_limits: CheckLimits
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ..., check_limits: _Optional[_Union[CheckLimits, _Mapping]] = ...) -> None: ...

class CheckLimits(_message.Message):
    __slots__ = ("timeout_s", "rows", "cell_chars")
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CELL_CHARS_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    rows: int
    cell_chars: int
    def __init__(self, timeout_s: _Optional[float] = ..., rows: _Optional[int] = ..., cell_chars: _Optional[int] = ...) -> None: ...

class CancelGeneration(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineEvent(_message.Message):
    __slots__ = ("attached", "ack", "progress", "tokens", "result", "error", "choice")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    ack: Ack
    progress: _types_pb2.Progress
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    error: _types_pb2.Error
    choice: _types_pb2.Choice
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., progress: _Optional[_Union[_types_pb2.Progress, _Mapping]] = ..., tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.Error, _Mapping]] = ..., choice: _Optional[_Union[_types_pb2.Choice, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("replica", "rebuilt")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    REBUILT_FIELD_NUMBER: _ClassVar[int]
    replica: str
    rebuilt: bool
    def __init__(self, replica: _Optional[str] = ..., rebuilt: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "replica")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    replica: str
    def __init__(self, seq: _Optional[int] = ..., replica: _Optional[str] = ...) -> None: ...

class EngineLocation(_message.Message):
    __slots__ = ("replica", "direct_target")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    DIRECT_TARGET_FIELD_NUMBER: _ClassVar[int]
    replica: str
    direct_target: str
    def __init__(self, replica: _Optional[str] = ..., direct_target: _Optional[str] = ...) -> None: ...

class EngineCompleteRequest(_message.Message):
    __slots__ = ("db", "question", "params", "mode", "tables", "request_id", "candidates", "check_limits")
    DB_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    CHECK_LIMITS_FIELD_NUMBER: _ClassVar[int]
    db: str
    question: str
    params: _types_pb2.SamplingParams
    mode: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    candidates: _types_pb2.CandidatesRequest
    check_limits: CheckLimits
    def __init__(self, db: _Optional[str] = ..., question: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., mode: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ..., check_limits: _Optional[_Union[CheckLimits, _Mapping]] = ...) -> None: ...

class CompleteRef(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class EngineSessionRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EngineSessionInfo(_message.Message):
    __slots__ = ("replica", "holds_session", "num_sessions", "num_attached", "num_queued", "seq", "cached_tokens", "kv_used_bytes", "kv_shared_bytes", "kv_budget_bytes", "kv_free_bytes", "num_data_sessions", "kv_data_bytes", "forward_tokens", "kv_block_tokens", "kv_blocks_used", "kv_blocks_shared", "kv_blocks_total", "data_lag_versions_max", "data_lag_versions_sum", "data_lag_seconds_max", "data_sessions_behind", "data_lag_bucket_bounds_s", "data_lag_bucket_counts", "data_lag_seconds_sum", "data_lag_count")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    HOLDS_SESSION_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTACHED_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_DATA_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    KV_DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_SHARED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_VERSIONS_MAX_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_VERSIONS_SUM_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_SECONDS_MAX_FIELD_NUMBER: _ClassVar[int]
    DATA_SESSIONS_BEHIND_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_BUCKET_BOUNDS_S_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_BUCKET_COUNTS_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_SECONDS_SUM_FIELD_NUMBER: _ClassVar[int]
    DATA_LAG_COUNT_FIELD_NUMBER: _ClassVar[int]
    replica: str
    holds_session: bool
    num_sessions: int
    num_attached: int
    num_queued: int
    seq: int
    cached_tokens: int
    kv_used_bytes: int
    kv_shared_bytes: int
    kv_budget_bytes: int
    kv_free_bytes: int
    num_data_sessions: int
    kv_data_bytes: int
    forward_tokens: int
    kv_block_tokens: int
    kv_blocks_used: int
    kv_blocks_shared: int
    kv_blocks_total: int
    data_lag_versions_max: int
    data_lag_versions_sum: int
    data_lag_seconds_max: float
    data_sessions_behind: int
    data_lag_bucket_bounds_s: _containers.RepeatedScalarFieldContainer[float]
    data_lag_bucket_counts: _containers.RepeatedScalarFieldContainer[int]
    data_lag_seconds_sum: float
    data_lag_count: int
    def __init__(self, replica: _Optional[str] = ..., holds_session: _Optional[bool] = ..., num_sessions: _Optional[int] = ..., num_attached: _Optional[int] = ..., num_queued: _Optional[int] = ..., seq: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kv_used_bytes: _Optional[int] = ..., kv_shared_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ..., kv_free_bytes: _Optional[int] = ..., num_data_sessions: _Optional[int] = ..., kv_data_bytes: _Optional[int] = ..., forward_tokens: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_shared: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., data_lag_versions_max: _Optional[int] = ..., data_lag_versions_sum: _Optional[int] = ..., data_lag_seconds_max: _Optional[float] = ..., data_sessions_behind: _Optional[int] = ..., data_lag_bucket_bounds_s: _Optional[_Iterable[float]] = ..., data_lag_bucket_counts: _Optional[_Iterable[int]] = ..., data_lag_seconds_sum: _Optional[float] = ..., data_lag_count: _Optional[int] = ...) -> None: ...

class DataRowWire(_message.Message):
    __slots__ = ("seq", "table", "values_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    VALUES_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    table: str
    values_json: str
    def __init__(self, seq: _Optional[int] = ..., table: _Optional[str] = ..., values_json: _Optional[str] = ...) -> None: ...

class DataSettingsWire(_message.Message):
    __slots__ = ("retention_tokens", "retention", "buffer_rows", "batch_rows", "max_row_chars", "max_row_tokens", "max_question_chars", "ready_exit_gap")
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ROWS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROW_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUESTION_CHARS_FIELD_NUMBER: _ClassVar[int]
    READY_EXIT_GAP_FIELD_NUMBER: _ClassVar[int]
    retention_tokens: int
    retention: str
    buffer_rows: int
    batch_rows: int
    max_row_chars: int
    max_row_tokens: int
    max_question_chars: int
    ready_exit_gap: float
    def __init__(self, retention_tokens: _Optional[int] = ..., retention: _Optional[str] = ..., buffer_rows: _Optional[int] = ..., batch_rows: _Optional[int] = ..., max_row_chars: _Optional[int] = ..., max_row_tokens: _Optional[int] = ..., max_question_chars: _Optional[int] = ..., ready_exit_gap: _Optional[float] = ...) -> None: ...

class DataOpenRequest(_message.Message):
    __slots__ = ("session_id", "db", "tenant", "settings", "rows")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    tenant: str
    settings: DataSettingsWire
    rows: _containers.RepeatedCompositeFieldContainer[DataRowWire]
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., tenant: _Optional[str] = ..., settings: _Optional[_Union[DataSettingsWire, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[DataRowWire, _Mapping]]] = ...) -> None: ...

class DataPushRequest(_message.Message):
    __slots__ = ("session_id", "rows")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rows: _containers.RepeatedCompositeFieldContainer[DataRowWire]
    def __init__(self, session_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[DataRowWire, _Mapping]]] = ...) -> None: ...

class DataPushReply(_message.Message):
    __slots__ = ("seqs", "dropped", "dropped_seqs", "dropped_total", "buffered", "data_version")
    SEQS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEQS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    dropped: int
    dropped_seqs: _containers.RepeatedScalarFieldContainer[int]
    dropped_total: int
    buffered: int
    data_version: int
    def __init__(self, seqs: _Optional[_Iterable[int]] = ..., dropped: _Optional[int] = ..., dropped_seqs: _Optional[_Iterable[int]] = ..., dropped_total: _Optional[int] = ..., buffered: _Optional[int] = ..., data_version: _Optional[int] = ...) -> None: ...

class DataQueryRequest(_message.Message):
    __slots__ = ("session_id", "question", "max_new_tokens", "execute")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXECUTE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    question: str
    max_new_tokens: int
    execute: bool
    def __init__(self, session_id: _Optional[str] = ..., question: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., execute: _Optional[bool] = ...) -> None: ...

class DataAnswer(_message.Message):
    __slots__ = ("question", "version", "text", "sql", "columns", "rows_json", "error", "logit_gap", "ms", "speculative")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOGIT_GAP_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    question: str
    version: int
    text: str
    sql: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    rows_json: str
    error: str
    logit_gap: float
    ms: float
    speculative: bool
    def __init__(self, question: _Optional[str] = ..., version: _Optional[int] = ..., text: _Optional[str] = ..., sql: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., rows_json: _Optional[str] = ..., error: _Optional[str] = ..., logit_gap: _Optional[float] = ..., ms: _Optional[float] = ..., speculative: _Optional[bool] = ...) -> None: ...

class DataEvaluateRequest(_message.Message):
    __slots__ = ("session_id", "questions", "max_new_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    questions: _containers.RepeatedScalarFieldContainer[str]
    max_new_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., questions: _Optional[_Iterable[str]] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class DataEvaluateReply(_message.Message):
    __slots__ = ("version", "answers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    answers: _containers.RepeatedCompositeFieldContainer[DataAnswer]
    def __init__(self, version: _Optional[int] = ..., answers: _Optional[_Iterable[_Union[DataAnswer, _Mapping]]] = ...) -> None: ...

class DataRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DataInfo(_message.Message):
    __slots__ = ("replica", "holds", "version", "rows_in_cache", "buffered", "dropped_total", "cache_tokens", "sliding_tokens", "retention", "describe_json")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROWS_IN_CACHE_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SLIDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    DESCRIBE_JSON_FIELD_NUMBER: _ClassVar[int]
    replica: str
    holds: bool
    version: int
    rows_in_cache: int
    buffered: int
    dropped_total: int
    cache_tokens: int
    sliding_tokens: int
    retention: str
    describe_json: str
    def __init__(self, replica: _Optional[str] = ..., holds: _Optional[bool] = ..., version: _Optional[int] = ..., rows_in_cache: _Optional[int] = ..., buffered: _Optional[int] = ..., dropped_total: _Optional[int] = ..., cache_tokens: _Optional[int] = ..., sliding_tokens: _Optional[int] = ..., retention: _Optional[str] = ..., describe_json: _Optional[str] = ...) -> None: ...
