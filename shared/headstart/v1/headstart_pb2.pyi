from headstart.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TypeRequest(_message.Message):
    __slots__ = ("open", "input", "submit")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    open: OpenStream
    input: Input
    submit: Submit
    def __init__(self, open: _Optional[_Union[OpenStream, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ..., submit: _Optional[_Union[Submit, _Mapping]] = ...) -> None: ...

class OpenStream(_message.Message):
    __slots__ = ("session_id", "db", "candidates")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    candidates: _types_pb2.CandidatesRequest
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("seq", "text")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Submit(_message.Message):
    __slots__ = ("seq", "text", "params", "candidates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    params: _types_pb2.SamplingParams
    candidates: _types_pb2.CandidatesRequest
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ...) -> None: ...

class TypeResponse(_message.Message):
    __slots__ = ("ready", "progress", "tokens", "result", "error", "choice")
    READY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    ready: Ready
    progress: _types_pb2.Progress
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    error: _types_pb2.Error
    choice: _types_pb2.Choice
    def __init__(self, ready: _Optional[_Union[Ready, _Mapping]] = ..., progress: _Optional[_Union[_types_pb2.Progress, _Mapping]] = ..., tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.Error, _Mapping]] = ..., choice: _Optional[_Union[_types_pb2.Choice, _Mapping]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("session_id", "db")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("db", "question", "params", "mode", "tables", "candidates")
    DB_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    db: str
    question: str
    params: _types_pb2.SamplingParams
    mode: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    candidates: _types_pb2.CandidatesRequest
    def __init__(self, db: _Optional[str] = ..., question: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., mode: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Union[_types_pb2.CandidatesRequest, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("tokens", "result", "choice")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    choice: _types_pb2.Choice
    def __init__(self, tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ..., choice: _Optional[_Union[_types_pb2.Choice, _Mapping]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("db",)
    DB_FIELD_NUMBER: _ClassVar[int]
    db: str
    def __init__(self, db: _Optional[str] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "db")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDatabasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Database(_message.Message):
    __slots__ = ("id", "num_tables", "can_execute")
    ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TABLES_FIELD_NUMBER: _ClassVar[int]
    CAN_EXECUTE_FIELD_NUMBER: _ClassVar[int]
    id: str
    num_tables: int
    can_execute: bool
    def __init__(self, id: _Optional[str] = ..., num_tables: _Optional[int] = ..., can_execute: _Optional[bool] = ...) -> None: ...

class ListDatabasesResponse(_message.Message):
    __slots__ = ("databases",)
    DATABASES_FIELD_NUMBER: _ClassVar[int]
    databases: _containers.RepeatedCompositeFieldContainer[Database]
    def __init__(self, databases: _Optional[_Iterable[_Union[Database, _Mapping]]] = ...) -> None: ...

class OpenDataRequest(_message.Message):
    __slots__ = ("db", "retention", "retention_tokens", "buffer_rows")
    DB_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ROWS_FIELD_NUMBER: _ClassVar[int]
    db: str
    retention: str
    retention_tokens: int
    buffer_rows: int
    def __init__(self, db: _Optional[str] = ..., retention: _Optional[str] = ..., retention_tokens: _Optional[int] = ..., buffer_rows: _Optional[int] = ...) -> None: ...

class OpenDataResponse(_message.Message):
    __slots__ = ("session_id", "db", "data_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    data_version: int
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., data_version: _Optional[int] = ...) -> None: ...

class DataValue(_message.Message):
    __slots__ = ("int_value", "real_value", "text_value", "null_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    REAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_VALUE_FIELD_NUMBER: _ClassVar[int]
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    real_value: float
    text_value: str
    null_value: bool
    def __init__(self, int_value: _Optional[int] = ..., real_value: _Optional[float] = ..., text_value: _Optional[str] = ..., null_value: _Optional[bool] = ...) -> None: ...

class DataRow(_message.Message):
    __slots__ = ("table", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DataValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DataValue, _Mapping]] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    values: _containers.MessageMap[str, DataValue]
    def __init__(self, table: _Optional[str] = ..., values: _Optional[_Mapping[str, DataValue]] = ...) -> None: ...

class PushRowsRequest(_message.Message):
    __slots__ = ("session_id", "rows", "push_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rows: _containers.RepeatedCompositeFieldContainer[DataRow]
    push_id: str
    def __init__(self, session_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[DataRow, _Mapping]]] = ..., push_id: _Optional[str] = ...) -> None: ...

class DataPushAck(_message.Message):
    __slots__ = ("seqs", "dropped", "dropped_seqs", "dropped_total", "buffered", "replayed_pushes")
    SEQS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEQS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_PUSHES_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    dropped: int
    dropped_seqs: _containers.RepeatedScalarFieldContainer[int]
    dropped_total: int
    buffered: int
    replayed_pushes: int
    def __init__(self, seqs: _Optional[_Iterable[int]] = ..., dropped: _Optional[int] = ..., dropped_seqs: _Optional[_Iterable[int]] = ..., dropped_total: _Optional[int] = ..., buffered: _Optional[int] = ..., replayed_pushes: _Optional[int] = ...) -> None: ...

class QueryDataRequest(_message.Message):
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

class DataQueryAnswer(_message.Message):
    __slots__ = ("question", "version", "text", "sql", "columns", "rows_json", "error", "logit_gap", "ms", "speculative", "source")
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
    SOURCE_FIELD_NUMBER: _ClassVar[int]
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
    source: str
    def __init__(self, question: _Optional[str] = ..., version: _Optional[int] = ..., text: _Optional[str] = ..., sql: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., rows_json: _Optional[str] = ..., error: _Optional[str] = ..., logit_gap: _Optional[float] = ..., ms: _Optional[float] = ..., speculative: _Optional[bool] = ..., source: _Optional[str] = ...) -> None: ...

class DataSessionRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DataDescription(_message.Message):
    __slots__ = ("session_id", "db", "data_version", "replica", "rows_in_cache", "buffered", "dropped_total", "cache_tokens", "sliding_tokens", "retention", "describe_json", "state", "failure")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ROWS_IN_CACHE_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SLIDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    DESCRIBE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    data_version: int
    replica: str
    rows_in_cache: int
    buffered: int
    dropped_total: int
    cache_tokens: int
    sliding_tokens: int
    retention: str
    describe_json: str
    state: str
    failure: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., data_version: _Optional[int] = ..., replica: _Optional[str] = ..., rows_in_cache: _Optional[int] = ..., buffered: _Optional[int] = ..., dropped_total: _Optional[int] = ..., cache_tokens: _Optional[int] = ..., sliding_tokens: _Optional[int] = ..., retention: _Optional[str] = ..., describe_json: _Optional[str] = ..., state: _Optional[str] = ..., failure: _Optional[str] = ...) -> None: ...

class CloseDataResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterFlashRequest(_message.Message):
    __slots__ = ("session_id", "question")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    question: str
    def __init__(self, session_id: _Optional[str] = ..., question: _Optional[str] = ...) -> None: ...

class FlashQuestion(_message.Message):
    __slots__ = ("id", "question", "answer_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    question: str
    answer_json: str
    def __init__(self, id: _Optional[str] = ..., question: _Optional[str] = ..., answer_json: _Optional[str] = ...) -> None: ...

class ListFlashResponse(_message.Message):
    __slots__ = ("questions",)
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    questions: _containers.RepeatedCompositeFieldContainer[FlashQuestion]
    def __init__(self, questions: _Optional[_Iterable[_Union[FlashQuestion, _Mapping]]] = ...) -> None: ...

class DeleteFlashRequest(_message.Message):
    __slots__ = ("session_id", "id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    id: str
    def __init__(self, session_id: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class DeleteFlashResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("session_id", "last_event_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    last_event_id: str
    def __init__(self, session_id: _Optional[str] = ..., last_event_id: _Optional[str] = ...) -> None: ...

class DataEvent(_message.Message):
    __slots__ = ("id", "kind", "payload_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    payload_json: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...
