"""The typing page on the trained model, in a real headless Chromium: type a question about
world_1, press Enter, see real SQL (not a random model's noise), Run it, and see its rows,
which must be the answer (the gold query's result on the same database).

An engine app of its own on the session's Ray Serve (the trained Qwen2.5-Coder-0.5B-Instruct,
served quantized, as `./run.sh demo` serves the default 1.5B), behind a gateway of its own.
"""

from __future__ import annotations

import sqlite3

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


def test_the_page_shows_the_trained_models_sql_and_its_rows(browser, serve_engine, tmp_path):
    from headstart.config import EngineSettings

    world = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"
    with sqlite3.connect(f"file:{world}?mode=ro", uri=True) as conn:
        (expected,) = conn.execute(GOLD).fetchone()
    settings = EngineSettings(model=SMALL_MODEL, threads=1, p0_cache_dir=tmp_path / "p0",
                              redis_url=serve_engine.redis_url)
    with own_engine_app(serve_engine, "hs-real-page", settings, served_model=SMALL_MODEL) as gateway:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{gateway.http_port}/?db=world_1")
        enter_token(browser, "tok-alice")
        browser.wait_for("document.getElementById('status').textContent.startsWith('session')", timeout_s=120)
        browser.eval("document.getElementById('question').focus()")
        browser.type_text(QUESTION, KEY_INTERVAL_S)
        browser.press_enter()
        browser.wait_for("(() => { const t = document.getElementById('ttft').textContent;"
                         " return /^TTFT [0-9.]+ ms$/.test(t) ? t : null; })()", timeout_s=120)
        sql = browser.eval("document.getElementById('sql').textContent")
        assert browser.eval("document.getElementById('error').textContent") == ""
        # a trained model's answer: one SQL query over the schema's own names
        assert sql.strip().upper().startswith("SELECT") and "country" in sql.lower(), sql
        browser.wait_for("!document.getElementById('run').disabled")
        browser.eval("document.getElementById('run').click()")
        cells = browser.wait_for("(() => { const t = document.querySelector('#rows table');"
                                 " return t && t.rows.length > 1 ? [...t.rows[1].cells].map(c => c.textContent)"
                                 " : null; })()", timeout_s=60)
        assert cells == [str(expected)], (sql, cells)
