"""The typing page in a real headless Chromium: pick world_1, type at human
speed, watch the cache bar fill, press Enter, see the SQL and its TTFT, Run it.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it.
"""

from __future__ import annotations

from tests.cdp import BROWSER_MARKS, browser, enter_token  # noqa: F401 (browser: a fixture)

pytestmark = BROWSER_MARKS
QUESTION = "How many countries are there?"
# the cache bar as the page shows it, once the session's first progress came (null before)
BAR = ("(() => { const b = document.getElementById('bar'); if (!b.dataset.prompt || b.dataset.prompt === '0')"
       " return null; return { cached: +b.dataset.cached, question: +b.dataset.question, schema: +b.dataset.schema,"
       " width: b.style.width, label: document.getElementById('bar-label').textContent }; })()")
KEY_INTERVAL_S = 0.12  # ~100 words per minute


def test_page_types_and_shows_sql(browser, serve_stack):
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{serve_stack.http_url}/?db=world_1")
    assert browser.wait_for("document.getElementById('status').textContent") == "enter the token above"
    enter_token(browser, "tok-alice")
    browser.wait_for("document.getElementById('status').textContent.startsWith('session')")
    assert browser.eval("document.getElementById('db').value") == "world_1"
    # only databases whose file is there: Spider's tables.json lists wta_1, whose file is not shipped
    options = browser.eval("[...document.getElementById('db').options].map((o) => o.value)")
    assert "world_1" in options and "wta_1" not in options
    # before a key: the bar is the question's part, none of it cached (the schema, all cached, apart)
    before = browser.wait_for(BAR)
    assert before["cached"] == 0 < before["question"] and before["width"] == "0%", before
    assert before["schema"] > 0 and f"schema: {before['schema']} tokens, cached" in before["label"], before
    browser.eval("document.getElementById('question').focus()")
    browser.type_text(QUESTION, KEY_INTERVAL_S)
    assert browser.eval("document.getElementById('question').value") == QUESTION
    after = browser.wait_for(f"(() => {{ const b = {BAR}; return b && b.question > {before['question']}"
                             " && b.cached === b.question ? b : null; })()")
    assert after["width"] == "100%" and after["schema"] == before["schema"], after
    assert after["label"].startswith(f"question: {after['question']} / {after['question']} tokens cached"), after
    browser.press_enter()
    ttft = browser.wait_for("(() => { const t = document.getElementById('ttft').textContent;"
                            " return /^TTFT [0-9.]+ ms$/.test(t) ? t : null; })()")
    sql = browser.eval("document.getElementById('sql').textContent")
    assert float(ttft.split()[1]) > 0
    assert sql.strip()
    assert browser.eval("document.getElementById('error').textContent") == ""
    # another database: nothing of world_1's question, answer or cache stays, and Run is off
    browser.eval("(() => { const db = document.getElementById('db'); db.value = 'concert_singer';"
                 " db.dispatchEvent(new Event('change')); })()")
    browser.wait_for("document.getElementById('status').textContent.endsWith('on concert_singer')")
    assert browser.eval("['question', 'sql', 'ttft', 'computed', 'checked', 'rows', 'error'].map((id) => {"
                        " const e = document.getElementById(id); return e.value ?? e.textContent; })") == [""] * 7
    assert browser.eval("document.getElementById('run').disabled") is True
    switched = browser.wait_for(BAR)
    assert switched["cached"] == 0 and switched["width"] == "0%" and switched["schema"] != before["schema"]
    # the token stays in the page's memory: not in the address, the storage or a cookie
    assert browser.eval("location.href.includes('tok-alice') || JSON.stringify(localStorage).includes('tok-alice')"
                        " || JSON.stringify(sessionStorage).includes('tok-alice') || document.cookie !== ''") is False


def test_a_token_in_an_old_link_is_dropped_from_the_address(browser, serve_stack):
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{serve_stack.http_url}/?token=tok-alice&db=world_1")
    browser.wait_for("document.getElementById('auth-note').textContent !== ''")
    assert browser.eval("location.search") == "?db=world_1"
    # not used either: the page waits for the token field
    assert browser.wait_for("document.getElementById('status').textContent") == "enter the token above"
