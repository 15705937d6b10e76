"""The `noisy` user class: a tenant at its limits, beside well-behaved ones.

Tenant safety (per-tenant shares, budgets and typed refusals) must keep one
tenant from slowing or breaking the others. A noisy user takes a bearer token
of its own (the last one the stack was given; with one token it shares it,
and says nothing about isolation) and, with no pause between calls:

- fires REST completions asking for four times the usual answer, back to
  back, so it runs into its tenant's share: a 429 is the answer it should
  get (event `rejected`), a 200 is `completed`;
- sends malformed requests (an unknown database, no question, a
  non-numeric length): each must come back as a typed 4xx at once (event
  `bad_input_refused`); a 5xx, a 200 or a timeout is a failure.

The other classes' TTFT in the same run (the report's table per class) is
what shows whether the noise reached them.
"""

from __future__ import annotations

import time

import requests
from locust import constant, task

from loadtest.users import SETTINGS, HeadstartUser, http_error
from headstart.client import ApiError

BAD_BODIES = (
    {"db": "no_such_database", "question": "How many rows?"},
    {"db": None},  # no question at all
    {"db": None, "question": "How many rows?", "max_new_tokens": "many"},
)


class NoisyTenant(HeadstartUser):
    """A tenant at its limits (module doc)."""

    abstract = True
    label = "noisy"
    wait_time = constant(0)

    def on_start(self) -> None:
        super().on_start()
        self.token = SETTINGS.tokens[-1] if SETTINGS.tokens else None
        self.http = requests.Session()
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"
        self.bad = 0

    def on_stop(self) -> None:
        self.http.close()

    def _post(self, body: dict) -> requests.Response | Exception:
        try:
            return self.http.post(self.host.rstrip("/") + "/v1/complete", json=body, timeout=SETTINGS.timeout_s)
        except requests.RequestException as exc:
            return exc

    @task(3)
    def flood(self) -> None:
        started = time.perf_counter()
        response = self._post({"db": self.db, "question": self.question(),
                               "max_new_tokens": SETTINGS.max_new_tokens * 4})
        if isinstance(response, Exception):
            self.fire("completed", started, exception=response)
        elif response.status_code == 429:
            self.fire("rejected", started)
        elif response.status_code == 200:
            self.fire("completed", started)
        else:
            self.fire("completed", started, exception=http_error(response))

    @task(1)
    def bad_input(self) -> None:
        body = dict(BAD_BODIES[self.bad % len(BAD_BODIES)])
        self.bad += 1
        if body["db"] is None:
            body["db"] = self.db
        started = time.perf_counter()
        response = self._post(body)
        if isinstance(response, Exception):
            self.fire("bad_input_refused", started, exception=response)
        elif 400 <= response.status_code < 500:  # 429 included: refused before it was even read is fine too
            self.fire("bad_input_refused", started)
        else:
            self.fire("bad_input_refused", started,
                      exception=ApiError(str(response.status_code), f"malformed request answered: {response.text[:200]}"))
