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
    __slots__ = ("session_id", "db")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("seq", "text")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Submit(_message.Message):
    __slots__ = ("seq", "text", "params")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    text: str
    params: _types_pb2.SamplingParams
    def __init__(self, seq: _Optional[int] = ..., text: _Optional[str] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class TypeResponse(_message.Message):
    __slots__ = ("ready", "progress", "tokens", "result", "error")
    READY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ready: Ready
    progress: _types_pb2.Progress
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    error: _types_pb2.Error
    def __init__(self, ready: _Optional[_Union[Ready, _Mapping]] = ..., progress: _Optional[_Union[_types_pb2.Progress, _Mapping]] = ..., tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.Error, _Mapping]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("session_id", "db")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    db: str
    def __init__(self, session_id: _Optional[str] = ..., db: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
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

class CompleteResponse(_message.Message):
    __slots__ = ("tokens", "result")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    tokens: _types_pb2.Tokens
    result: _types_pb2.Result
    def __init__(self, tokens: _Optional[_Union[_types_pb2.Tokens, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.Result, _Mapping]] = ...) -> None: ...

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
