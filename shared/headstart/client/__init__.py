"""Python client of the public gRPC API (`headstart.v1.Headstart`).

    from headstart.client import HeadstartClient

    with HeadstartClient("localhost:50051", token="...") as client:
        with client.typing("world_1") as s:
            for text in ("How", "How many", "How many countries?"):
                s.input(text)
            result = s.submit("How many countries?")
        print(result.sql, result.ttft_ms)

Execution-checked answers: `complete_checked(db, question, candidates=4)` and
`typing(db, candidates=4)` ... `submit_checked(text)` return a `CheckedAnswer`
(the greedy `result`, the `choice` with the chosen SQL and its `rows`).

Data sessions (rows, queries, flash questions, events): `open_data`,
`push_rows`, `query_data`, `describe_data`, `close_data`, `register_flash`,
`list_flash`, `delete_flash`, `subscribe` (see `headstart.client.data`).

`AsyncHeadstartClient` is the same API with `async`/`await`.
"""

from headstart.client.data import answer_rows
from headstart.client.aio import AsyncHeadstartClient, AsyncTypingSession
from headstart.client.checked import CheckedAnswer, choice_rows
from headstart.client.errors import ApiError
from headstart.client.sync import HeadstartClient, TypingSession

__all__ = ["answer_rows", "ApiError", "AsyncHeadstartClient", "AsyncTypingSession", "CheckedAnswer",
           "HeadstartClient", "TypingSession", "choice_rows"]
