"""What the `headstart loadtest` command tells the Locust process it starts.

Locust runs in a process of its own (gevent monkey-patches the standard
library, which Ray and the in-process gateway must not see), so the settings
travel as environment variables with the `HEADSTART_LOADTEST_` prefix.
Nothing here imports Locust.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields

PREFIX = "HEADSTART_LOADTEST_"
DEFAULT_DBS = ("world_1", "concert_singer", "pets_1", "car_1")
# One row of world_1's `city` per push slot; "{n}" counts up from FIRST_ROW_NUMBER (loadtest/rows.py).
DEFAULT_DATA_ROW = ('{"table": "city", "values": {"ID": "{n}", "Name": "Loadtown {n}", "CountryCode": "NLD", '
                    '"District": "Load", "Population": "{n}"}}')


@dataclass
class LoadSettings:
    """Everything a load-test user needs besides Locust's `--host` (the HTTP URL).

    Attributes:
        grpc_target: host:port of the gateway's public gRPC port.
        tokens: bearer tokens, one per tenant; users take them in turn (none: no auth).
        dbs: Spider databases; users take them in turn, questions come from their dev set.
        max_new_tokens: answer length asked for by every submit and completion.
        wpm, typo_rate, pause_s: the seeded typist (`headstart.typist.Typist`).
        seed: seeds the question order and every user's typist.
        timeout_s: deadline of one request; past it the request fails as a timeout.
        samples_path: JSON lines of every request event (one per line), for our report.
        data_db: database of the data users' sessions (a SQLite one: Spider ids are).
        data_row: JSON template of one pushed row (`loadtest.rows.RowTemplate`).
        data_rows_per_push: rows in one push.
        data_push_interval_s: a data producer pushes once per this many seconds.
        flash_push_interval_s: a flash subscriber pushes once per this many seconds
            (slower: each push is a new version whose questions the flash worker re-answers).
        flash_question: the question a flash subscriber registers.
        acked_path: JSON lines of every acknowledged push ({token, sid, seqs}); when set (a run
            with faults) the data users also leave their sessions open at the end, so the
            command can check that no acknowledged row was lost (loadtest/faults.py).
        answers_path: JSON lines of every typed session's outcome (opened, submitted, ended, the
            answer's token ids or the error; `loadtest.users.record_answer`); set in a run with faults.
        rate: the open-loop client's arrivals per second (`loadtest.completers.OpenLoopClient`).
        arrival: `fixed` (every 1/rate s) or `poisson` (exponential gaps of mean 1/rate).
        length_sets: `IN:OUT` (question tokens : answer tokens) pairs the open-loop requests take in turn.
        max_in_flight: open-loop requests at once; an arrival past it fails (ClientOverloaded).
    """

    grpc_target: str = "127.0.0.1:50051"
    tokens: list[str] = field(default_factory=list)
    dbs: list[str] = field(default_factory=lambda: list(DEFAULT_DBS))
    max_new_tokens: int = 16
    wpm: float = 60.0
    typo_rate: float = 0.03
    pause_s: float = 0.3
    seed: int = 0
    timeout_s: float = 120.0
    samples_path: str = ""
    data_db: str = "world_1"
    data_row: str = DEFAULT_DATA_ROW
    data_rows_per_push: int = 5
    data_push_interval_s: float = 1.0
    flash_push_interval_s: float = 5.0
    flash_question: str = "How many cities are there?"
    acked_path: str = ""
    answers_path: str = ""
    rate: float = 1.0
    arrival: str = "poisson"
    length_sets: list[str] = field(default_factory=lambda: ["32:16"])
    max_in_flight: int = 256

    def to_env(self) -> dict[str, str]:
        out = {}
        for key, value in asdict(self).items():
            out[PREFIX + key.upper()] = ",".join(value) if isinstance(value, list) else str(value)
        return out

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "LoadSettings":
        """Read the settings back; a variable that is absent keeps its default."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is None:
                continue
            # NOTE: the annotations are strings here (`from __future__ import annotations`)
            if f.type == "list[str]":
                values[f.name] = [v for v in raw.split(",") if v]
            elif f.type == "int":
                values[f.name] = int(raw)
            elif f.type == "float":
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        return cls(**values)
