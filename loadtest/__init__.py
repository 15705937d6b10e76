"""Locust load tests of a headstart gateway (`headstart loadtest SCENARIO ...`).

`settings.py` is what the command hands the Locust process (environment
variables); `users.py` holds the Locust user classes (they import Locust and
gevent, so only the Locust process imports them); `scenarios/*.py` are the
locustfiles; `run.py` starts the stack and Locust; `report.py` turns what
Locust recorded into our table and plot; `memory.py` samples process memory.
"""
