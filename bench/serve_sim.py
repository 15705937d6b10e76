"""`python -m bench.serve_sim`: `bench serve`'s workload replayed on the real
scheduler with a modelled forward cost, in virtual time.

Not a measurement of the engine: a model of the one forward worker, for
comparing scheduler rules where the shared machine is too loaded for `bench
serve` to mean anything (its 2 torch threads then run 10-40x slower). The
rules are the real ones (`headstart.engine.sched.scheduler.Scheduler`, the job
hints the engine gives); what is modelled:

- a forward of R rows and T new tokens takes `A + B*(R-1) + C*(T-R)` ms
  (fitted to docs/benchmarks-archive.md "Why batch on a CPU at all": 0.5B fp32,
  2 threads: 1 row 1 token 155 ms, 8x1 214 ms, 8x3 319 ms, 8x7 460 ms);
- text is ~4 characters a token; a typing step keeps the tokens of the text
  up to its last space and extends to the whole text (the headstart policy
  recomputes the partial word) and the prompt's turn end (5 tokens): the
  headstart policy commits the whole prompt at every step; a submit whose
  prompt is all cached has its first token at once (the logits at hand);
- a submit arriving during a forward that has a preemptible row stops it
  after one layer (1/24 of it), and none of its rows progresses;
- no answer-ahead (the anticipatory side gets no free tokens).

Typists are `bench serve`'s: `Typist(wpm, pause_s)` traces of Spider world_1
questions, all starting together, each answer `max_new_tokens` long (the
first from the prefill). Prints TTFT p50 and total p50 (submit -> last
token) per mode and rule set, writes serve_sim.json, serve_sim.md and
serve_sim.png to --out.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from headstart.engine.sched.scheduler import Scheduler
from headstart.engine.sched.jobs import Job, JobWork, Priority, StepOutcome

A_MS, B_MS, C_MS = 150.0, 8.4, 5.5
TURN_END_TOKENS = 5
LAYERS = 24


def forward_ms(rows: int, tokens: int) -> float:
    return A_MS + B_MS * (rows - 1) + C_MS * max(0, tokens - rows)


def ntok(text: str) -> int:
    return (len(text) + 3) // 4


@dataclass
class Typist:
    """One simulated user: keystrokes (t, text), submit time, and its state."""

    name: str
    events: list
    submit_t: float
    question: str
    cached: int = 0  # tokens of the typed text in the cache (anticipatory)
    text: str = ""
    typing_job: Job | None = None
    answer: "Answer | None" = None


@dataclass
class Answer:
    typist: Typist
    submit_t: float
    prefill: int
    left: int
    first_t: float | None = None
    last_t: float | None = None
    job: Job | None = field(default=None, repr=False)


class Sim:
    def __init__(self, scheduler: Scheduler, typists: list[Typist], anticipate: bool, max_new: int):
        self.s, self.typists, self.anticipate, self.max_new = scheduler, typists, anticipate, max_new
        self.now = 0.0
        self.events: list = []  # (t, seq, kind, typist, text)
        seq = 0
        for ty in typists:
            if anticipate:
                for t, text in ty.events:
                    heapq.heappush(self.events, (t, seq, "key", ty.name, text))
                    seq += 1
            heapq.heappush(self.events, (ty.submit_t, seq, "submit", ty.name, ty.question))
            seq += 1
        self.by_name = {ty.name: ty for ty in typists}

    # -- jobs --------------------------------------------------------------------

    def _typing_target(self, ty: Typist) -> tuple[int, int]:
        """(tokens a step keeps, tokens wanted): the whole prompt is wanted;
        the partial word and the turn end after it are recomputed."""
        stable = ty.text[:ty.text.rfind(" ") + 1]
        return ntok(stable), ntok(ty.text) + TURN_END_TOKENS

    def _typing_job(self, ty: Typist) -> Job:
        return Job(_SimTyping(self, ty), Priority.STREAM, f"type:{ty.name}", owner=ty.name)

    def _answer_job(self, ans: Answer) -> Job:
        return Job(_SimAnswer(ans), Priority.SUBMIT, f"submit:{ans.typist.name}", owner=ans.typist.name)

    # -- events ------------------------------------------------------------------

    def _apply_events(self, until: float) -> bool:
        """Apply events up to `until`; True when a submit arrived."""
        submitted = False
        while self.events and self.events[0][0] <= until:
            t, _, kind, name, text = heapq.heappop(self.events)
            ty = self.by_name[name]
            if kind == "key":
                ty.text, ty.last_change = text, t
                ty.cached = min(ty.cached, ntok(text[:text.rfind(" ") + 1]))  # the common prefix
                self._kick(ty, t)
            else:
                submitted = True
                if ty.typing_job is not None:
                    ty.typing_job.cancel()
                    ty.typing_job = None
                full = ntok(text) + TURN_END_TOKENS
                kept = min(ty.cached, full) if self.anticipate else 0
                ans = Answer(ty, t, prefill=full - kept, left=self.max_new)
                ty.answer = ans
                if ans.prefill == 0:  # the first token from the logits at hand
                    ans.first_t, ans.left = t, self.max_new - 1
                ans.job = self._answer_job(ans)
                self.s.add(ans.job, t)
        return submitted

    def _kick(self, ty: Typist, t: float) -> None:
        if ty.typing_job is None and ty.answer is None:
            ty.typing_job = self._typing_job(ty)
            self.s.add(ty.typing_job, t)

    def run(self) -> list[Answer]:
        for ty in self.typists:
            ty.last_change = 0.0
        while self.events or self.s.num_waiting:
            if not self.s.num_waiting:
                self.now = max(self.now, self.events[0][0])
                self._apply_events(self.now)
                continue
            plan = self.s.schedule(self.now)
            if not plan.planned:
                continue
            ms = forward_ms(len(plan.planned), plan.num_tokens)
            end = self.now + ms / 1000.0
            preemptible = any(r.job.priority == Priority.STREAM or r.job.decode_step for r in plan.planned)
            nxt_submit = next((e[0] for e in sorted(self.events) if e[2] == "submit" and e[0] < end), None)
            if preemptible and nxt_submit is not None:
                end = min(end, nxt_submit + ms / 1000.0 / LAYERS)
                self._apply_events(end)
                self.now = end
                self.s.postprocess(plan, [StepOutcome(not r.job.cancelled) for r in plan.planned], self.now)
                continue
            self._apply_events(end)
            self.now = end
            self.s.postprocess(plan, [StepOutcome(self._commit(r.job, r.num_tokens)) for r in plan.planned], self.now)
        return [ty.answer for ty in self.typists]

    def _commit(self, job: Job, tokens: int) -> bool:
        ty = self.by_name[job.owner]
        if job.priority == Priority.STREAM:
            if job.cancelled:
                return False
            stable, full = self._typing_target(ty)
            ty.cached = min(ty.cached, stable) + tokens
            more = ty.cached < full
            if not more:
                ty.typing_job = None
            return more
        ans = ty.answer
        if ans.prefill:
            ans.prefill = 0
            ans.first_t = self.now
        ans.left -= 1
        if ans.left <= 0:
            ans.last_t = self.now
            return False
        return True


RULES = {
    "main (typing,decode, defer 1000 ms)": dict(batch_scope="typing,decode", decode_defer_s=1.0),
    "this branch (typing+decode, riders, 8 typing tokens)": dict(batch_scope="typing+decode", decode_defer_s=1.0,
                                                                  stream_tokens=8),
}


def simulate(n: int, rounds: int, wpm: float, pause_s: float, max_new: int, seed: int) -> list[dict]:
    from bench.common import spider_questions
    from headstart.typist import Typist as TraceTypist

    questions = [q["question"] for q in spider_questions(["world_1"], 40, seed)]
    tracer = TraceTypist(wpm=wpm, pause_s=pause_s, seed=seed)
    rows = []
    for label, rules in RULES.items():
        for anticipate in (True, False):
            answers = []
            for r in range(rounds):
                typists = []
                for i in range(n):
                    q = questions[(i * rounds + r) % len(questions)]
                    trace = tracer.trace(q)
                    typists.append(Typist(f"u{i}", [(e.t, e.text) for e in trace.events], trace.submit_t, q))
                scheduler = Scheduler(max_batch_rows=8, max_batch_tokens=64, **rules)
                answers += Sim(scheduler, typists, anticipate, max_new).run()
            ttft = [1000 * (a.first_t - a.submit_t) for a in answers]
            total = [1000 * (a.last_t - a.submit_t) for a in answers]
            rows.append({"rules": label, "mode": "anticipatory" if anticipate else "prefix", "n": n,
                         "ttft_p50_ms": statistics.median(ttft), "total_p50_ms": statistics.median(total)})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| rules | N | anticipatory TTFT p50 ms | prefix TTFT p50 ms | TTFT ratio | anticipatory total p50 ms "
           "| prefix total p50 ms | total ratio |", "|---|---|---|---|---|---|---|---|"]
    for label in RULES:
        for n in sorted({r["n"] for r in rows}):
            a = next(r for r in rows if r["rules"] == label and r["n"] == n and r["mode"] == "anticipatory")
            p = next(r for r in rows if r["rules"] == label and r["n"] == n and r["mode"] == "prefix")
            out.append(f"| {label} | {n} | {a['ttft_p50_ms']:.0f} | {p['ttft_p50_ms']:.0f} | "
                       f"{a['ttft_p50_ms'] / p['ttft_p50_ms']:.2f} | {a['total_p50_ms']:.0f} | {p['total_p50_ms']:.0f} | "
                       f"{a['total_p50_ms'] / p['total_p50_ms']:.2f} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, style in zip(RULES, ("--o", "-s")):
        pts = []
        for n in sorted({r["n"] for r in rows}):
            a = next(r for r in rows if r["rules"] == label and r["n"] == n and r["mode"] == "anticipatory")
            p = next(r for r in rows if r["rules"] == label and r["n"] == n and r["mode"] == "prefix")
            pts.append((n, a["total_p50_ms"] / p["total_p50_ms"]))
        ax.plot(*zip(*pts), style, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("concurrent typists")
    ax.set_ylabel("total p50, anticipatory / prefix (modelled)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class _SimTyping(JobWork):
    """A simulated typist's job: the engine session's hints, on the simulated text."""

    def __init__(self, sim, typist: Typist):
        self.sim, self.typist = sim, typist

    def step(self) -> bool:
        return True

    def order_key(self) -> float:
        return self.typist.last_change

    def cost(self) -> int:
        stable, full = self.sim._typing_target(self.typist)
        return max(1, full - min(self.typist.cached, stable))


class _SimAnswer(JobWork):
    """A simulated answer's job: a request's hints (shortest prefill first, then decode steps)."""

    def __init__(self, answer: Answer):
        self.answer = answer

    def step(self) -> bool:
        return True

    def order_key(self) -> float:
        return 1.0 if self.answer.prefill == 0 else self.answer.prefill / 257

    def cost(self) -> int:
        return self.answer.prefill or 1

    def decoding(self) -> bool:
        return self.answer.prefill == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wpm", type=float, default=60.0)
    ap.add_argument("--pause", type=float, default=0.3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench-out/serve_sim"))
    args = ap.parse_args()
    rows = []
    for n in args.concurrency:
        rows += simulate(n, args.rounds, args.wpm, args.pause, args.max_new_tokens, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_sim.json").write_text(json.dumps({"model": {"a_ms": A_MS, "b_ms": B_MS, "c_ms": C_MS},
                                                          "args": {k: str(v) for k, v in vars(args).items()},
                                                          "rows": rows}, indent=2))
    md = table(rows)
    (args.out / "serve_sim.md").write_text(md)
    plot(rows, args.out / "serve_sim.png")
    print(md)


if __name__ == "__main__":
    main()
