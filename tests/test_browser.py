"""The typing page in a real headless Chromium: pick world_1, type at human
speed, watch the cache bar fill, press Enter, see the SQL and its TTFT, Run it.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it.
"""

from __future__ import annotations

from tests.cdp import BROWSER_MARKS, browser, enter_token  # noqa: F401 (browser: a fixture)

pytestmark = BROWSER_MARKS
QUESTION = "How many countries are there?"
KEY_INTERVAL_S = 0.12  # ~100 words per minute


def test_page_types_and_shows_sql(browser, serve_stack):
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{serve_stack.http_url}/?db=world_1")
    assert browser.wait_for("document.getElementById('status').textContent") == "enter the token above"
    enter_token(browser, "tok-alice")
    browser.wait_for("document.getElementById('status').textContent.startsWith('session')")
    assert browser.eval("document.getElementById('db').value") == "world_1"
    browser.eval("document.getElementById('question').focus()")
    browser.type_text(QUESTION, KEY_INTERVAL_S)
    assert browser.eval("document.getElementById('question').value") == QUESTION
    cached = browser.wait_for(
        "(() => { const b = document.getElementById('bar').dataset;"
        " return b.prompt > 0 && b.cached === b.prompt ? [+b.cached, +b.prompt] : null; })()")
    assert cached[0] == cached[1] > 0
    browser.press_enter()
    ttft = browser.wait_for("(() => { const t = document.getElementById('ttft').textContent;"
                            " return /^TTFT [0-9.]+ ms$/.test(t) ? t : null; })()")
    sql = browser.eval("document.getElementById('sql').textContent")
    assert float(ttft.split()[1]) > 0
    assert sql.strip()
    assert browser.eval("document.getElementById('error').textContent") == ""
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
