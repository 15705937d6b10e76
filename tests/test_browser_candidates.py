"""The typing page with execution-checked answers, on the trained model in a real headless Chromium:
type a question about world_1, press Enter, and the checked SQL's rows appear without a Run click,
with how many candidates agreed. The rows must be the answer (the gold query's result).

An engine app of its own on the session's Ray Serve (the trained Qwen2.5-Coder-0.5B-Instruct,
served quantized, with HEADSTART_CANDIDATES=4), behind a gateway of its own. The page asks the
same 4 with `wait_all` (`?candidates=4&wait_all=1`: on a shared CPU not every candidate decoded
during the pause is done at Enter); the session decodes them during the pause and hands them to
the submit.
"""

from __future__ import annotations

import sqlite3
import time

import pytest

from headstart.kernels import cpu_isa
from headstart.models.catalogue import SMALL_MODEL
from headstart.paths import default_spider_dir
from tests.cdp import BROWSER_MARKS, browser, enter_token  # noqa: F401 (browser: a fixture)
from tests.serve_fixture import own_engine_app

pytestmark = [*BROWSER_MARKS,
              pytest.mark.skipif(not cpu_isa.supported(), reason="the quantized kernels need x86-64 with AVX2")]
QUESTION = "How many countries are there?"
GOLD = "SELECT count(*) FROM country"
KEY_INTERVAL_S = 0.12
K = 4
PAUSE_S = 1.0  # the user's pause before Enter: the candidates decode in it


def test_the_page_shows_the_checked_sql_and_its_rows_at_enter(browser, serve_engine, tmp_path):
    from headstart.config import EngineSettings

    world = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"
    with sqlite3.connect(f"file:{world}?mode=ro", uri=True) as conn:
        (expected,) = conn.execute(GOLD).fetchone()
    settings = EngineSettings(model=SMALL_MODEL, threads=1, p0_cache_dir=tmp_path / "p0", candidates=K,
                              redis_url=serve_engine.redis_url)
    with own_engine_app(serve_engine, "hs-checked-page", settings, served_model=SMALL_MODEL) as gateway:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{gateway.http_port}/?db=world_1&candidates={K}&wait_all=1")
        enter_token(browser, "tok-alice")
        browser.wait_for("document.getElementById('status').textContent.startsWith('session')", timeout_s=120)
        browser.eval("document.getElementById('question').focus()")
        browser.type_text(QUESTION, KEY_INTERVAL_S)
        time.sleep(PAUSE_S)
        browser.press_enter()
        checked = browser.wait_for("(() => { const t = document.getElementById('checked').textContent;"
                                   " return /agree|ran/.test(t) ? t : null; })()", timeout_s=180)
        assert checked.endswith(f"of {K} candidates agree"), (checked, browser.eval(
            "document.getElementById('error').textContent"))
        agreed = int(checked.split()[0])
        assert 1 <= agreed <= K
        # the rows are there with no Run click: the checked answer's, and they are the answer
        cells = browser.eval("(() => { const t = document.querySelector('#rows table');"
                             " return t && t.rows.length > 1 ? [...t.rows[1].cells].map(c => c.textContent)"
                             " : null; })()")
        sql = browser.eval("document.getElementById('sql').textContent")
        assert cells == [str(expected)], (sql, cells)
        assert sql.strip().upper().startswith("SELECT") and "country" in sql.lower(), sql
        assert browser.eval("document.getElementById('error').textContent") == ""
