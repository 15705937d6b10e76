"""Integration (issue 29): no local account runs code through the stack's Ray.

The real stack of tests/serve_fixture.py runs Ray as `headstart serve` does
(`start_ray`: Ray's token auth on). A job submission without credentials,
as another local account would send it, goes to every port any of the
stack's processes listens on (Ray's job agent, runtime-env agent, metrics
exporters, Serve's HTTP proxy, the gateway): no port may accept it, and the
job's entrypoint (a command that writes a marker file) must never run. On
the old stack (`RAY_AUTH_MODE=disabled`) the job agent answered 200 and ran
it. The job agent itself must be among the ports and refuse for want of a
token (401), and take a request that carries the token, so the test cannot
pass by missing it. The flash worker gets the engine secret from a 0600
file, not from its environment.
"""

from __future__ import annotations

import os
import stat
import sys
import time

import httpx
import pytest

from tests.test_serve_loopback import _listeners, _stack_pids

pytestmark = pytest.mark.slow
JOB_ROUTES = ("/api/job_agent/jobs/", "/api/jobs/")  # the agent's and the dashboard head's submission routes


def _submit(port: int, route: str, marker, headers=None) -> int | None:
    """POST a job whose entrypoint writes `marker`; the HTTP status, or None when the port is not HTTP."""
    body = {"entrypoint": f"{sys.executable} -c \"open('{marker}', 'w').write('ran')\"",
            "submission_id": f"attack-{port}-{route.count('agent')}"}
    try:
        return httpx.post(f"http://127.0.0.1:{port}{route}", json=body, headers=headers or {}, timeout=5).status_code
    except httpx.HTTPError:  # gRPC, plasma and other non-HTTP ports
        return None


def _environ_after_exec(pid: int, timeout_s: float = 10.0) -> list[bytes]:
    """The process's environment once it runs the worker (before its exec /proc shows the parent's)."""
    deadline = time.monotonic() + timeout_s
    while b"services.flash" not in open(f"/proc/{pid}/cmdline", "rb").read():
        assert time.monotonic() < deadline, "the flash worker did not start"
        time.sleep(0.01)
    return open(f"/proc/{pid}/environ", "rb").read().split(b"\0")


def test_no_port_of_the_stack_runs_an_unauthenticated_job(serve_stack, serve_engine, tmp_path):
    marker = tmp_path / "ran"
    listeners = _listeners(_stack_pids())
    answers = {}
    for _ip, port, name in sorted(set(listeners), key=lambda t: t[1]):
        for route in JOB_ROUTES:
            status = _submit(port, route, marker)
            if status is not None:
                answers[(port, route)] = (status, name)
    accepted = {k: v for k, v in answers.items() if 200 <= v[0] < 300}
    assert not accepted, f"a job submission without credentials was accepted: {accepted}"
    agents = [port for (port, route), (status, name) in answers.items()
              if route == JOB_ROUTES[0] and status == 401 and "DashboardAgent" in name]
    assert agents, f"Ray's job agent was not among the listeners, or did not refuse for want of a token: {answers}"
    # The refusal is the token's: with it, the agent answers (a GET of its job list: nothing is submitted).
    ok = httpx.get(f"http://127.0.0.1:{agents[0]}/api/job_agent/jobs/attack-x",
                   headers=serve_engine.ray_auth.header(), timeout=5)
    assert ok.status_code not in (401, 403), ok.text
    time.sleep(1.0)  # a job that was accepted would have started by now
    assert not marker.exists(), "the job's entrypoint ran"


def test_ray_token_file_is_private(serve_engine):
    path = serve_engine.ray_auth.token_path
    assert os.environ.get("RAY_AUTH_MODE") == "token" and "RAY_AUTH_TOKEN" not in os.environ
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_flash_worker_has_no_secret_in_its_environment(serve_engine):
    from services.flash.local import start_local_worker

    worker = start_local_worker(serve_engine.redis_url, serve_engine.grpc_target, serve_engine.app_name,
                                serve_engine.secret, consumer="env-check")
    try:
        environ = _environ_after_exec(worker.process.pid)
        assert not any(serve_engine.secret.encode() in item for item in environ)
        path = next(item.split(b"=", 1)[1] for item in environ if item.startswith(b"HEADSTART_ENGINE_SECRET_FILE="))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and open(path).read() == serve_engine.secret
    finally:
        worker.stop()
    assert not os.path.exists(path)  # removed with the worker
