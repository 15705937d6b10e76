"""`headstart bench neighbour`: does a tenant at its limits slow another one down?

Tenant A ("noisy") runs at its limits for a whole phase: its share of
WebSocket sessions each sending long texts as fast as its rate limits let it,
opens of a database whose server never answers (a registered PostgreSQL
alias pointing at a listener that accepts and stays silent), and heavy Runs
(a recursive CTE that runs to the deadline). Tenant B ("quiet") types Spider
questions at human speed and presses Enter. Phases alternate in one run
(B alone, B beside A, B beside A, B alone, ...), so a shared machine's drift
weighs on both sides. Reported for B: client TTFT p50/p99 and answer time
(submit -> done) p50, alone and beside A, and their ratio; plus what A got
done and refused. Writes neighbour.json, neighbour.md, neighbour.png. A
benchmark, not a test: it never fails on a timing.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path

from bench.common import percentile, spider_questions, write_json
from bench.serve_typists import Sample, ws_typist
from headstart.typist import Typist

TOKENS = ["noisy=tok-noisy", "quiet=tok-quiet"]
SLOW_DB = "stuck_pg"
# What A does (`--noise`, to measure each apart): long texts on its share of
# WebSockets, opens of a database that never answers, heavy Runs.
NOISE_KINDS = ("typers", "opens", "runs")
HEAVY_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@contextlib.contextmanager
def silent_listener():
    """A TCP port that accepts connections and never says a word (a database that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


class NoisyTenant:
    """Tenant A at its limits until `stop` is set; counts what it got done and what was refused.

    Runs in a process of its own (`noisy_process`), so its client work does
    not share an event loop or the GIL with B's client."""

    def __init__(self, http_url: str, share: int, text_chars: int, noise: tuple[str, ...] = NOISE_KINDS):
        self.http_url, self.share, self.text_chars = http_url, share, text_chars
        self.noise = noise
        self.counts: dict[str, int] = {}

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._typer(i, stop)) for i in range(self.share) if "typers" in self.noise]
        tasks += [asyncio.create_task(self._slow_opens(stop)) for _ in range(2) if "opens" in self.noise]
        tasks += [asyncio.create_task(self._heavy_runs(stop)) for _ in range(4) if "runs" in self.noise]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _typer(self, i: int, stop: asyncio.Event) -> None:
        from websockets.asyncio.client import connect

        url = f"{self.http_url.replace('http', 'ws', 1)}/v1/sessions/ws?db=world_1&token=tok-noisy"
        async with connect(url, max_size=4 << 20, open_timeout=60) as ws:
            ready = json.loads(await ws.recv())
            self._count("ws_" + ready.get("code", ready["type"]))
            if ready["type"] != "ready":
                return

            async def drain():
                with contextlib.suppress(Exception):  # the connection closes when the phase ends
                    async for raw in ws:
                        message = json.loads(raw)
                        if message["type"] == "error":
                            self._count("input_" + message["code"])

            reader = asyncio.create_task(drain())
            seq = 0
            while not stop.is_set():  # a new long text every message: all of it must be prefilled
                seq += 1
                text = f"{seq} {i} " + ("select every column of every table " * 200)[: self.text_chars]
                await ws.send(json.dumps({"type": "input", "seq": seq, "text": text}))
                self._count("inputs_sent")
                await asyncio.sleep(0.02)
            reader.cancel()

    async def _slow_opens(self, stop: asyncio.Event) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=60) as client:
            while not stop.is_set():
                r = await client.post(f"{self.http_url}/v1/sessions", json={"db": SLOW_DB},
                                      headers={"authorization": "Bearer tok-noisy"})
                self._count("slow_open_" + r.json().get("code", "OK"))
                if r.json().get("code") == "RESOURCE_EXHAUSTED":
                    await asyncio.sleep(0.05)  # at its limit, not flooding: floods are for a proxy in front

    async def _heavy_runs(self, stop: asyncio.Event) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=60) as client:
            while not stop.is_set():
                r = await client.post(f"{self.http_url}/v1/execute", json={"db": "world_1", "sql": HEAVY_SQL},
                                      headers={"authorization": "Bearer tok-noisy"})
                self._count("run_" + r.json().get("code", "OK"))
                if r.json().get("code") == "RESOURCE_EXHAUSTED":
                    await asyncio.sleep(0.05)


def noisy_process(http_url: str, share: int, text_chars: int, stop, counts,
                  noise_kinds: tuple[str, ...] = NOISE_KINDS) -> None:
    """Process entry: tenant A until the multiprocessing Event `stop` is set; its counts into `counts`."""
    noise = NoisyTenant(http_url, share, text_chars, noise_kinds)

    async def main():
        done = asyncio.Event()

        async def watch():
            while not stop.is_set():
                await asyncio.sleep(0.1)
            done.set()

        watcher = asyncio.create_task(watch())
        await noise.run(done)
        await watcher

    asyncio.run(main())
    counts.update(noise.counts)


async def _phases(stack, questions, rounds, per_phase, typist, max_new, share, text_chars, say,
                  noise: tuple[str, ...] = NOISE_KINDS):
    samples: dict[str, list[Sample]] = {"alone": [], "beside A": []}
    lags: dict[str, list[dict]] = {"alone": [], "beside A": []}  # the gateway loop's lag, per phase
    probe = stack.gateway.service.loop_lag
    noisy_counts: dict[str, int] = {}
    ws_url = stack.http_url.replace("http", "ws", 1)
    q = 0
    for r in range(rounds):
        for noisy in ((False, True) if r % 2 == 0 else (True, False)):
            if noisy:
                ctx = multiprocessing.get_context("spawn")
                manager = ctx.Manager()
                stop, counts = manager.Event(), manager.dict()
                proc = ctx.Process(target=noisy_process,
                                   args=(stack.http_url, share, text_chars, stop, counts, noise))
                proc.start()
                await asyncio.sleep(5.0)  # A reaches its limits before B starts
            probe.reset()
            for _ in range(per_phase):
                trace = typist.trace(questions[q % len(questions)])
                q += 1
                sample = await ws_typist(ws_url, "tok-quiet", "world_1", trace, True, max_new)
                samples["beside A" if noisy else "alone"].append(sample)
            lags["beside A" if noisy else "alone"].append(probe.stats())
            if noisy:
                stop.set()
                await asyncio.to_thread(proc.join, 120)
                for key, n in dict(counts).items():
                    noisy_counts[key] = noisy_counts.get(key, 0) + n
                manager.shutdown()
            say(f"round {r + 1}/{rounds} {'beside A' if noisy else 'alone'} done")
    return samples, noisy_counts, lags


def _lag_summary(stats: list[dict]) -> dict:
    """The gateway loop's lag over a phase kind: the median of its phases' p50 and the worst p99."""
    if not stats:
        return {"loop_lag_p50_ms": None, "loop_lag_p99_ms": None}
    p50s = sorted(s["p50_ms"] for s in stats)
    return {"loop_lag_p50_ms": p50s[len(p50s) // 2], "loop_lag_p99_ms": max(s["p99_ms"] for s in stats)}


def _row(phase: str, samples: list[Sample]) -> dict:
    ok = [s for s in samples if not s.error]
    ttft, answer = [s.ttft_ms for s in ok], [s.client_total_ms for s in ok if s.client_total_ms is not None]
    return {"phase": phase, "num_samples": len(samples), "num_errors": len(samples) - len(ok),
            "errors": sorted({s.error for s in samples if s.error}),
            "ttft_p50_ms": percentile(ttft, 50) if ttft else None, "ttft_p99_ms": percentile(ttft, 99) if ttft else None,
            "answer_p50_ms": percentile(answer, 50) if answer else None,
            "engine_ttft_p50_ms": percentile([s.engine_ttft_ms for s in ok], 50) if ok else None}


def run_neighbour_bench(out_dir: str | Path, model: str = DEFAULT_MODEL, dtype: str = "float32",
                        rounds: int = 2, per_phase: int = 6, max_new_tokens: int = 16, text_chars: int = 3000,
                        max_sessions: int = 8, wpm: float = 90.0, seed: int = 0, say=print,
                        noise: tuple[str, ...] = NOISE_KINDS) -> dict:
    """Start a local stack (two tenants, a stuck PostgreSQL alias), run the phases, write the report."""
    from services.launcher import serve_command

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = [q["question"] for q in spider_questions(["world_1"], 40, seed)]
    typist = Typist(wpm=wpm, pause_s=0.2, seed=seed)
    share = max_sessions // len(TOKENS)  # one replica: capacity / tenants
    with silent_listener() as port:
        previous = os.environ.get("HEADSTART_CATALOGUE_POSTGRES")
        os.environ["HEADSTART_CATALOGUE_POSTGRES"] = f"{SLOW_DB}=postgresql://u@127.0.0.1:{port}/x"
        try:
            stack = serve_command(model=model, dtype=dtype, replicas=1, port=0, grpc_port=0, tokens=TOKENS,
                                  max_sessions=max_sessions, block=False, say=say)
        finally:
            if previous is None:
                os.environ.pop("HEADSTART_CATALOGUE_POSTGRES", None)
            else:
                os.environ["HEADSTART_CATALOGUE_POSTGRES"] = previous
        try:
            from headstart.client import HeadstartClient

            with HeadstartClient(stack.grpc_target, token="tok-quiet", timeout_s=600) as client:
                client.complete("world_1", "warm up", 1)
            started = time.perf_counter()
            samples, noisy, lags = asyncio.run(_phases(stack, questions, rounds, per_phase, typist, max_new_tokens,
                                                       share, text_chars, say, noise))
            wall_s = time.perf_counter() - started
        finally:
            stack.stop()
    rows = [_row(phase, s) | _lag_summary(lags[phase]) for phase, s in samples.items()]
    alone, beside = rows
    ratios = {k: (beside[k] / alone[k] if alone[k] and beside[k] else None)
              for k in ("ttft_p50_ms", "answer_p50_ms")}
    report = {"config": {"model": model, "dtype": dtype, "rounds": rounds, "per_phase": per_phase,
                         "max_new_tokens": max_new_tokens, "text_chars": text_chars, "max_sessions": max_sessions,
                         "noisy_share": share, "wpm": wpm, "noise": list(noise), "load_avg_1m_at_end": os.getloadavg()[0],
                         "cpu_count": os.cpu_count(), "wall_s": wall_s},
              "rows": rows, "ratios_beside_over_alone": ratios, "noisy_counts": noisy,
              "goal": "B's TTFT p50 beside A within 1.5x of B alone",
              "samples": {k: [s.as_dict() for s in v] for k, v in samples.items()}}
    write_json(out_dir / "neighbour.json", report)
    md = table(rows, ratios, noisy)
    (out_dir / "neighbour.md").write_text(md)
    plot(samples, out_dir / "neighbour.png")
    say(md)
    return report


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(rows: list[dict], ratios: dict, noisy: dict) -> str:
    out = ["| B (quiet tenant) | samples | errors | TTFT p50 ms | TTFT p99 ms | answer p50 ms | engine TTFT p50 ms "
           "| gateway loop lag p50 / p99 ms |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['phase']} | {r['num_samples']} | {r['num_errors']} | {_fmt(r['ttft_p50_ms'])} | "
            f"{_fmt(r['ttft_p99_ms'])} | {_fmt(r['answer_p50_ms'])} | {_fmt(r['engine_ttft_p50_ms'])} | "
            f"{_fmt(r.get('loop_lag_p50_ms'))} / {_fmt(r.get('loop_lag_p99_ms'))} |" for r in rows]
    out += [f"| ratio beside/alone | | | {_fmt(ratios['ttft_p50_ms'])}x | | {_fmt(ratios['answer_p50_ms'])}x | | |", ""]
    out += ["A (noisy tenant) during its phases: " + ", ".join(f"{k} {v}" for k, v in sorted(noisy.items())), ""]
    return "\n".join(out)


def plot(samples: dict[str, list[Sample]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, stat in zip(axes, ("ttft_ms", "client_total_ms")):
        data = [[getattr(s, stat) for s in v if not s.error and getattr(s, stat) is not None] for v in samples.values()]
        ax.boxplot(data)
        ax.set_xticks(range(1, len(samples) + 1), list(samples))
        ax.set_title(f"B's {stat.replace('client_total_ms', 'answer').replace('_ms', '')} (ms)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
