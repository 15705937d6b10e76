"""The figures of a load test per user class, from the exact samples the users wrote.

A sample is a request (also a Locust event) or a metric of one
(`loadtest.users`). Per class: answers, answers/s and output tokens/s over
the run's window, TTFT p50/p90/p99, ITL p50/p99 (every gap between streamed
pieces of every answer), the complete answer p50/p99, sessions opened,
rejections, keystroke round trips, tokens computed at submit, failures and
timeouts; for data users the push round trip and a push's ack to its
`data_updated` / `flash_ready`.
"""

from __future__ import annotations

from collections import defaultdict

from bench.common import percentile

NOT_COUNTING_COMPUTED = {"rest_complete"}  # its JSON answer has no computed_tokens_at_submit


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def run_window_s(samples: list[dict]) -> float | None:
    """Seconds from the first request's start to the last sample (None without timestamps)."""
    times = [(s["t"] - (s["ms"] or 0) / 1000.0, s["t"]) for s in samples if "t" in s]
    if not times:
        return None
    return max(0.001, max(end for _, end in times) - min(start for start, _ in times))


def summarize(samples: list[dict], window_s: float | None = None) -> dict[str, dict]:
    """Per user class: counts, rates and percentiles of each figure (`window_s`: the run's, else from the samples)."""
    window_s = window_s or run_window_s(samples)
    by_user: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_user[s["user"]][s["name"]].append(s)
    return {user: _summarize_class(user, names, window_s) for user, names in sorted(by_user.items())}


def _summarize_class(user: str, names: dict[str, list[dict]], window_s: float | None) -> dict:
    ok = {name: [s for s in rows if not s["error"]] for name, rows in names.items()}
    errors = [s for rows in names.values() for s in rows if s["error"]]

    def ms(name: str) -> list[float]:
        return [s["ms"] for s in ok.get(name, []) if s["ms"] is not None]

    answers = ok.get("answer", [])
    tokens = sum(s["length"] for s in answers)
    ttft, rtt, answer_ms, rejected = ms("ttft"), ms("keystroke_rtt"), ms("answer"), ms("rejected")
    itl = [v for s in ok.get("itl", []) for v in s.get("values", [])]
    computed = [s["length"] for s in ok.get("ttft", [])] if user not in NOT_COUNTING_COMPUTED else []
    out = {
        "num_opened": len(ok.get("open", [])), "num_answers": len(answers), "num_rejected": len(rejected),
        "answers_per_s": round(len(answers) / window_s, 3) if window_s else None,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / window_s, 1) if window_s else None,
        "rejection_p50_ms": _pct(rejected, 50), "rejection_p99_ms": _pct(rejected, 99),
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
        "itl_p50_ms": _pct(itl, 50), "itl_p99_ms": _pct(itl, 99), "num_itl_gaps": len(itl),
        "answer_p50_ms": _pct(answer_ms, 50), "answer_p99_ms": _pct(answer_ms, 99),
        "keystroke_rtt_p50_ms": _pct(rtt, 50), "keystroke_rtt_p99_ms": _pct(rtt, 99), "num_keystrokes": len(rtt),
        "computed_at_submit_mean": round(sum(computed) / len(computed), 1) if computed else None,
        "num_failures": len(errors), "num_timeouts": sum(1 for s in errors if s["error"] == "TimeoutError"),
        "failures_by_kind": dict(sorted(_count(f"{s['name']}:{s['error']}" for s in errors).items())),
        "window_s": round(window_s, 1) if window_s else None,
    }
    if "push" in names:  # a data user (loadtest/data_users.py)
        push, updated, flash = ms("push"), ms("data_updated"), ms("flash_ready")
        out.update({
            "is_data_user": True, "num_pushes": len(push),
            "num_rows_pushed": sum(s["length"] for s in ok.get("push", [])),
            "push_p50_ms": _pct(push, 50), "push_p99_ms": _pct(push, 99),
            "data_updated_p50_ms": _pct(updated, 50), "data_updated_p99_ms": _pct(updated, 99),
            "num_flash_answers": len(flash), "flash_ready_p50_ms": _pct(flash, 50),
            "flash_ready_p99_ms": _pct(flash, 99),
        })
    return out


def _count(keys) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for k in keys:
        counts[k] += 1
    return counts
