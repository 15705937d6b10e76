"""Load-test scenarios: each file is a locustfile with a `SCENARIO` dict of defaults.

`SCENARIO` (a literal: `headstart loadtest` reads it without importing the
file, so Ray never meets gevent) holds `users`, `spawn_rate`, `run_time` and
the local stack's `max_sessions` (sessions per replica: admission's limit).
"""
