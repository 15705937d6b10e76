"""The local stack as `headstart demo` starts it: quiet, and ready when it says so (a real Ray)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from services.engine.ray_stack import free_port

# In a process of its own: its stdout is a pipe, as a user's `./run.sh demo | tee` is, and Ray's
# driver-side state leaves with it.
SCRIPT = textwrap.dedent("""
    import sys, time, urllib.request
    from services.launcher import serve_command

    def ready(stack):
        print("ready: GET / ->", urllib.request.urlopen(stack.http_url + "/", timeout=5).status, flush=True)

    stack = serve_command(model="random:tiny", port=int(sys.argv[1]), grpc_port=int(sys.argv[2]), threads=1,
                          block=False, on_ready=ready, quiet=True)
    time.sleep(3)  # the flash worker's start-up: its INFO line came after "open"
    stack.stop()
    print("stopped", flush=True)
""")


def test_quiet_stack_says_ready_once_its_page_answers_and_prints_no_ray_lines(tmp_path):
    """issue 46: "open" came ~30 s before the port accepted connections, then Ray's INFO lines and a
    yellow shutdown warning as raw ANSI codes. `on_ready` runs once the page answers (the GET in it
    succeeds), and with `quiet` nothing of Ray's reaches the terminal, start to stop."""
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port()), str(free_port())], capture_output=True,
                          text=True, env=env, timeout=240, cwd=os.getcwd())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = proc.stdout.splitlines()
    assert lines.index("ready: GET / -> 200") == next(i for i, line in enumerate(lines)
                                                      if line.startswith("headstart is up")) + 1, out
    assert lines[-1] == "stopped", out
    assert "\x1b[" not in out, out  # no color codes into a pipe
    assert not [line for line in out.splitlines() if " INFO " in line or line.startswith("INFO ")], out
    assert "graceful_shutdown" not in out and "(raylet)" not in out, out
