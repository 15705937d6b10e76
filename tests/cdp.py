"""A minimal Chrome DevTools Protocol driver for the browser test (no Playwright needed).

Starts Debian's `chromium` (or $HEADSTART_CHROMIUM) headless with a private
profile, opens one page and talks CDP over its WebSocket with the
`websockets` package the project already depends on.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import httpx
import pytest
from websockets.sync.client import connect

CANDIDATES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("HEADSTART_CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.path.isfile(env) else None)
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


CHROMIUM = find_chromium()
# what every browser test module marks itself with: slow, and skipped (saying why) without a Chromium
BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: install Debian's `chromium` package "
                       "(apt-get install -y chromium) or set HEADSTART_CHROMIUM"),
]


@pytest.fixture
def browser():
    """A headless Chromium with one page, stopped after the test (import it into a test module)."""
    b = Browser(CHROMIUM)
    yield b
    b.close()


class Browser:
    """One headless Chromium with one page; `close()` stops it."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="hs-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.port = self._devtools_port()
        page = next(t for t in httpx.get(f"http://127.0.0.1:{self.port}/json/list").json() if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=16 << 20)
        self._ids = itertools.count(1)

    def _devtools_port(self, timeout_s: float = 30.0) -> int:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            line = self.proc.stderr.readline()
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line or "")
            if match:
                return int(match.group(1))
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools server")

    def call(self, method: str, **params) -> dict:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"timed out waiting for {expression}")

    def type_text(self, text: str, interval_s: float) -> None:
        """Key presses at human speed into the focused element."""
        for ch in text:
            self.call("Input.dispatchKeyEvent", type="keyDown", text=ch, key=ch, unmodifiedText=ch)
            self.call("Input.dispatchKeyEvent", type="keyUp", key=ch)
            time.sleep(interval_s)

    def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                      nativeVirtualKeyCode=13)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def enter_token(browser: Browser, token: str) -> None:
    """Type a bearer token into the page's token field, as a user does (it is never in the URL)."""
    browser.wait_for("!document.getElementById('auth-bar').hidden")
    browser.eval(f"(() => {{ const t = document.getElementById('token'); t.value = {token!r};"
                 " t.dispatchEvent(new Event('change')); })()")
