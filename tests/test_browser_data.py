"""The page's live data panel in a real headless Chromium, on the real stack
(Ray Serve, random:tiny, Redis): open a data session on world_1, push sample
rows and watch them arrive by SSE; register a flash question and watch its
SQL and rows appear, then update after a new push.

The flash part runs the real flash worker (`python -m services.flash`, as
`headstart serve` does) beside the stack: the `serve_stack` fixture has none.
Needs Debian's `chromium`; skipped without it.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.cdp import BROWSER_MARKS, Browser, enter_token, browser  # noqa: F401 (browser: a fixture)

pytestmark = BROWSER_MARKS
QUESTION = "How many cities are there?"
# A data session's first open prefills world_1's schema, and a flash answer
# waits for the worker's turn on a loaded CI machine: generous, never a timing assertion.
WAIT_S = 180.0


@pytest.fixture
def flash_worker(serve_engine):
    """The flash worker process (as `headstart serve` runs it) on the stack's engine and Redis."""
    from services.flash.local import start_local_worker

    worker = start_local_worker(serve_engine.redis_url, serve_engine.grpc_target, serve_engine.app_name,
                                serve_engine.secret, consumer=f"browser-test-{uuid.uuid4().hex[:8]}",
                                max_new_tokens=16)
    yield worker
    worker.stop()


def open_panel(browser: Browser, stack) -> None:
    """The data panel alone, a data session open on world_1 and its event stream subscribed."""
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{stack.http_url}/?view=data&data_db=world_1")
    browser.wait_for("document.getElementById('typing-panel')?.hidden === true")
    # the data view alone has the token field too (it sits above both panels)
    enter_token(browser, "tok-alice")
    browser.wait_for("document.getElementById('data-db').value === 'world_1'")
    browser.eval("document.getElementById('data-open').click()")
    browser.wait_for("document.getElementById('data-status').dataset.events === 'open'"
                     " || document.getElementById('data-error').textContent", WAIT_S)
    assert browser.eval("document.getElementById('data-error').textContent") == ""
    assert browser.eval("document.getElementById('data-status').textContent").startswith("data session ")
    # the sample rows: a template of world_1's first table, read from its schema
    browser.wait_for("document.getElementById('data-rows').value.includes('\"city\"')")


def push(browser: Browser, repeat: int) -> int:
    """Push `repeat` sample rows with the page's button; the newest row's seq (from the ack)."""
    before = int(browser.eval("document.getElementById('data-pushed').dataset.rows"))
    browser.eval(f"document.getElementById('data-repeat').value = '{repeat}'")
    browser.eval("document.getElementById('data-push').click()")
    browser.wait_for(f"+document.getElementById('data-pushed').dataset.rows === {before + repeat}"
                     " || document.getElementById('data-error').textContent")
    assert browser.eval("document.getElementById('data-error').textContent") == ""
    return int(browser.eval("document.querySelector('#data-last tr:nth-child(2) td').textContent"))


def test_panel_shows_rows_arriving(browser, serve_stack):
    open_panel(browser, serve_stack)
    newest = push(browser, 3)
    assert browser.eval("document.querySelectorAll('#data-last tr').length") == 1 + 3
    # data_updated by SSE: the version reaches the newest row's seq, every row counted once
    browser.wait_for(f"+document.getElementById('data-version').dataset.version >= {newest}", WAIT_S)
    browser.wait_for("+document.getElementById('data-count').dataset.rows === 3", WAIT_S)
    states = browser.eval("[...document.querySelectorAll('#data-last tr')].slice(1).map(r => r.cells[3].textContent)")
    assert states == ["ingested"] * 3
    assert browser.eval("document.getElementById('data-dropped').dataset.dropped") in ("0", 0)
    newest2 = push(browser, 2)
    assert newest2 == newest + 2
    browser.wait_for(f"+document.getElementById('data-version').dataset.version >= {newest2}", WAIT_S)
    browser.wait_for("+document.getElementById('data-count').dataset.rows === 5", WAIT_S)


def flash_card(browser: Browser, after_version: int) -> dict:
    """The (only) flash card once it shows an answer of a version > `after_version`."""
    return browser.wait_for(
        "(() => { const c = document.querySelector('#flash-list .flash');"
        f" if (!c || !c.dataset.version || +c.dataset.version <= {after_version}) return null;"
        " return {version: +c.dataset.version, question: c.querySelector('.question').textContent,"
        " sql: c.querySelector('.sql') ? c.querySelector('.sql').textContent : null,"
        " rows: !!c.querySelector('.answer-rows'), error: c.querySelector('.answer-error')?.textContent ?? null}; })()",
        WAIT_S)


def test_panel_flash_question_updates_on_a_new_push(browser, serve_stack, flash_worker):
    open_panel(browser, serve_stack)
    browser.eval(f"document.getElementById('flash-question').value = {QUESTION!r}")
    browser.eval("document.getElementById('flash-add').click()")
    browser.wait_for("document.querySelector('#flash-list .flash .question')?.textContent === " + repr(QUESTION))
    assert "waiting" in browser.eval("document.querySelector('#flash-list .flash .meta').textContent")

    newest = push(browser, 2)
    first = flash_card(browser, 0)
    assert first["question"] == QUESTION and first["version"] >= newest
    # the answer's SQL, and its rows or the SQL's error (random:tiny writes nonsense SQL)
    assert first["sql"] is not None and (first["rows"] or first["error"])

    newest2 = push(browser, 1)
    second = flash_card(browser, first["version"])
    assert second["version"] >= newest2
    assert second["sql"] is not None and (second["rows"] or second["error"])
    assert browser.eval("document.querySelectorAll('#flash-list .flash').length") == 1

    # the card's × deletes the question: gone from the page and from the gateway's list
    browser.eval("document.querySelector('#flash-list .flash button').click()")
    browser.wait_for("document.querySelectorAll('#flash-list .flash').length === 0")
    sid = browser.eval("document.getElementById('data-status').dataset.session")
    listed = httpx.get(f"{serve_stack.http_url}/v1/data/{sid}/flash", headers={"Authorization": "Bearer tok-alice"})
    assert listed.status_code == 200 and listed.json() == []
