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
    __slots__ = ("session_id", "db", "policy", "seq", "text")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    policy: str
    seq: int
    text: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ..., policy: _Optional[str] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("seq", "text")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class EngineSubmit(_message.Message):
    __slots__ = ("seq", "text", "params")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    params: _types_pb2.SamplingParams
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class CancelGeneration(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineEvent(_message.Message):
    __slots__ = ("attached", "ack", "progress", "tokens", "result", "error")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    ack: Ack
    progress: _types_pb2.Progress
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    error: _types_pb2.Error
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., progress: _Optional[_Union[_types_pb2.Progress, _Mapping]] = ..., tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.Error, _Mapping]] = ...) -> None: ...

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

class EngineCompleteRequest(_message.Message):
    __slots__ = ("db", "question", "params", "mode", "tables")
    DB_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    db: str
    question: str
    params: _types_pb2.SamplingParams
    mode: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, db: _Optional[str] = ..., question: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., mode: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineSessionRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EngineSessionInfo(_message.Message):
    __slots__ = ("replica", "holds_session", "num_sessions", "num_attached", "num_queued", "seq", "cached_tokens", "kv_used_bytes", "kv_shared_bytes", "kv_budget_bytes", "kv_free_bytes")
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
    def __init__(self, replica: _Optional[str] = ..., holds_session: _Optional[bool] = ..., num_sessions: _Optional[int] = ..., num_attached: _Optional[int] = ..., num_queued: _Optional[int] = ..., seq: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kv_used_bytes: _Optional[int] = ..., kv_shared_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ..., kv_free_bytes: _Optional[int] = ...) -> None: ...
