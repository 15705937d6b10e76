"""Data sessions (issue 12): a live KV cache of a schema plus the recent rows
of the session's tables, so a question costs only its own tokens.

Above the engine: a `DataSession` runs its ingestion, retention and queries
as jobs on the runtime's one forward worker (no second scheduler).
"""

from headstart.data.session import DataSession
from headstart.data.types import DataSettings, FlashAnswer, PushAck, QueryResult, VersionEvent

__all__ = ["DataSession", "DataSettings", "FlashAnswer", "PushAck", "QueryResult", "VersionEvent"]
