from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TableCacheDatabaseRef(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: str
    def __init__(self, spec: _Optional[str] = ...) -> None: ...

class TableCacheDatabaseStatus(_message.Message):
    __slots__ = ("name", "db_id", "schema_hash", "model", "dtype", "mode", "num_tables", "num_groups", "num_blocks", "num_bytes", "complete", "key_prefix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DB_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NUM_TABLES_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    db_id: str
    schema_hash: str
    model: str
    dtype: str
    mode: str
    num_tables: int
    num_groups: int
    num_blocks: int
    num_bytes: int
    complete: bool
    key_prefix: str
    def __init__(self, name: _Optional[str] = ..., db_id: _Optional[str] = ..., schema_hash: _Optional[str] = ..., model: _Optional[str] = ..., dtype: _Optional[str] = ..., mode: _Optional[str] = ..., num_tables: _Optional[int] = ..., num_groups: _Optional[int] = ..., num_blocks: _Optional[int] = ..., num_bytes: _Optional[int] = ..., complete: _Optional[bool] = ..., key_prefix: _Optional[str] = ...) -> None: ...

class TableCachePrecomputeRequest(_message.Message):
    __slots__ = ("spec", "model", "dtype", "mode", "force")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    spec: str
    model: str
    dtype: str
    mode: str
    force: bool
    def __init__(self, spec: _Optional[str] = ..., model: _Optional[str] = ..., dtype: _Optional[str] = ..., mode: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class TableCachePrecomputeProgress(_message.Message):
    __slots__ = ("db_id", "group_index", "num_groups", "tables", "num_tokens", "num_bytes", "skipped", "seconds", "status")
    DB_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    db_id: str
    group_index: int
    num_groups: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    num_tokens: int
    num_bytes: int
    skipped: bool
    seconds: float
    status: TableCacheDatabaseStatus
    def __init__(self, db_id: _Optional[str] = ..., group_index: _Optional[int] = ..., num_groups: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ..., num_tokens: _Optional[int] = ..., num_bytes: _Optional[int] = ..., skipped: _Optional[bool] = ..., seconds: _Optional[float] = ..., status: _Optional[_Union[TableCacheDatabaseStatus, _Mapping]] = ...) -> None: ...

class TableCacheListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableCacheListReply(_message.Message):
    __slots__ = ("databases",)
    DATABASES_FIELD_NUMBER: _ClassVar[int]
    databases: _containers.RepeatedCompositeFieldContainer[TableCacheDatabaseStatus]
    def __init__(self, databases: _Optional[_Iterable[_Union[TableCacheDatabaseStatus, _Mapping]]] = ...) -> None: ...

class TableCacheInvalidateReply(_message.Message):
    __slots__ = ("changed", "old_schema_hash", "new_schema_hash", "num_blocks_deleted", "status")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    OLD_SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    NEW_SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_DELETED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    old_schema_hash: str
    new_schema_hash: str
    num_blocks_deleted: int
    status: TableCacheDatabaseStatus
    def __init__(self, changed: _Optional[bool] = ..., old_schema_hash: _Optional[str] = ..., new_schema_hash: _Optional[str] = ..., num_blocks_deleted: _Optional[int] = ..., status: _Optional[_Union[TableCacheDatabaseStatus, _Mapping]] = ...) -> None: ...

class TableCacheCleanOrphansRequest(_message.Message):
    __slots__ = ("grace_s",)
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    grace_s: float
    def __init__(self, grace_s: _Optional[float] = ...) -> None: ...

class TableCacheCleanOrphansReply(_message.Message):
    __slots__ = ("num_index_entries_removed", "num_payloads_removed", "num_payloads_kept_young")
    NUM_INDEX_ENTRIES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    NUM_PAYLOADS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    NUM_PAYLOADS_KEPT_YOUNG_FIELD_NUMBER: _ClassVar[int]
    num_index_entries_removed: int
    num_payloads_removed: int
    num_payloads_kept_young: int
    def __init__(self, num_index_entries_removed: _Optional[int] = ..., num_payloads_removed: _Optional[int] = ..., num_payloads_kept_young: _Optional[int] = ...) -> None: ...
