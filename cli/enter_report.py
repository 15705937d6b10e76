"""What the engine was doing when a replayed user pressed Enter, read from the forward trace.

`headstart demo` prints it under the session mode's TTFT: a session's TTFT
is not a fixed cost but what was left at Enter. When the last keystrokes'
tokens are still being computed (each keystroke recomputes the word being
typed and the prompt's end after it), the submit waits for that forward (a
forward in flight is never aborted: it computes tokens the answer needs),
while the prefix mode meets an idle engine. When the pause was long enough,
the answer's first tokens were decoded ahead and the TTFT is about nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = {"type": "its typing catch-up", "ahead": "its answer-ahead decoding",
         "candidates": "its candidates' decoding", "submit": "the answer"}


def forwards(path: Path) -> list[dict]:
    """The trace's lines (`headstart.engine.sched.forward_trace`), in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def enter_report(lines: list[dict], enter_t: float, first_token_t: float, answer_ahead: int) -> str:
    """One line: what ran between Enter and the first token, on the trace's clock (`t`: seconds
    since it opened). `answer_ahead`: the answer tokens decoded during the pause and used."""
    if answer_ahead:
        return (f"at Enter: the answer's first {answer_ahead} token(s) were decoded during the pause "
                "(answer-ahead): the TTFT is the time to hand them over")
    running = [f for f in lines if f["t"] < enter_t < f["t"] + f["ms"] / 1000.0]
    if not running:
        return ("at Enter: the engine was idle and the prompt cached; the TTFT is the answer's own forwards "
                f"({(first_token_t - enter_t) * 1000.0:.0f} ms)")
    f = running[0]
    kinds = sorted({row[0].split(":")[0] for row in f["rows"]})
    what = " and ".join(KINDS.get(k, k) for k in kinds)
    tokens = sum(row[3] for row in f["rows"])
    which = (": the last keystrokes and the prompt's end after them, recomputed at each key" if kinds == ["type"]
             else "")
    waited = (f["t"] + f["ms"] / 1000.0 - enter_t) * 1000.0
    return (f"at Enter a forward of {what} ({tokens} new tokens{which}) had run {(enter_t - f['t']) * 1000.0:.0f}"
            f" ms; the answer waited {waited:.0f} ms for it (a forward in flight is not aborted), where the "
            "prefix mode met an idle engine")
