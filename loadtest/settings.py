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
            if f.name in ("tokens", "dbs"):
                values[f.name] = [v for v in raw.split(",") if v]
            elif f.name in ("max_new_tokens", "seed"):
                values[f.name] = int(raw)
            elif f.name in ("wpm", "typo_rate", "pause_s", "timeout_s"):
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        return cls(**values)
