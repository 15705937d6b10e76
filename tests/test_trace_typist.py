"""Typing traces (file format) and the seeded synthetic typist."""

from __future__ import annotations

import pytest

from headstart.trace import TraceError, parse_trace
from headstart.typist import Typist


def test_parse_trace_round_trip():
    trace = Typist(wpm=60, typo_rate=0.2, pause_s=1.0, seed=3).trace("How many singers?")
    again = parse_trace(trace.to_jsonl())
    assert again.final_text == "How many singers?"
    assert [e.text for e in again.events] == [e.text for e in trace.events]
    assert again.submit_t == pytest.approx(trace.submit_t, abs=1e-6)


@pytest.mark.parametrize(("body", "message"), [
    ('{"t": 0, "text": "a"}\n', "no submit"),
    ('{"t": 1, "text": "a"}\n{"t": 0.5, "submit": true}\n', "not smaller"),
    ('not json\n', "not JSON"),
    ('{"t": 0, "submit": true}\n{"t": 1, "text": "a"}\n', "after the submit"),
    ('{"t": 0, "txt": "a"}\n{"t": 1, "submit": true}\n', "expected a 'text'"),
])
def test_parse_trace_errors(body, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(body)


def test_typist_is_seeded_and_timed():
    a = Typist(wpm=40, typo_rate=0.5, pause_s=2.0, seed=1).trace("select all")
    b = Typist(wpm=40, typo_rate=0.5, pause_s=2.0, seed=1).trace("select all")
    assert a == b
    assert a.final_text == "select all"
    assert len(a.events) > len("select all")  # typos add a wrong key and a backspace each
    interval = 60 / (40 * 5)
    assert a.submit_t - a.events[-1].t == pytest.approx(interval + 2.0)
    assert all(0.6 * interval - 1e-9 <= y.t - x.t <= 1.4 * interval + 1e-9 for x, y in zip(a.events, a.events[1:]))
