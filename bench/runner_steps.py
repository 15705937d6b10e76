"""`python -m bench.runner_steps`: what the runner's forwards cost over the engine's caches.

The engine's own steps, apart from sessions and the scheduler: the unit the
KV layout (`engine/kv/block_pool.py`, `engine/kv/paged_cache.py`) changes. Over a
P0 of `--p0` tokens shared by `--rows` states, each round times:

- **cold prefill**: a fresh cache over `--cold` tokens (`runner.prefill`);
- **prefix extension**: `--extend` tokens on a share of P0 (a prefix
  request's catch-up, a session's typing row);
- **decode, 1 row**: one token at a time on one share (a lone answer);
- **decode, N rows**: one token on each of `--rows` shares in one forward
  (answers riding together).

Each row of the table is the median over `--rounds` rounds of each round's
mean ms. The script uses only APIs older than the block pool (`ModelRunner`,
`KVState.share`, `Row`), so the same file measures an older tree
(put that tree first on PYTHONPATH) against this one, alternating, which is
how docs/benchmarks.md compares them. Writes runner_steps.json, .md and .png
to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import markdown_table, write_json

STEPS = ("cold prefill", "prefix extension", "decode, 1 row", "decode, N rows")


def _round(runner, ids: list[int], p0, args) -> dict[str, float]:
    from headstart.engine.runner.rows import Row

    out = {}
    start = time.perf_counter()
    runner.prefill(ids[:args.cold])
    out["cold prefill"] = (time.perf_counter() - start) * 1000.0
    states = [p0.share() for _ in range(args.rows)]
    at = args.p0
    start = time.perf_counter()
    for state in states:
        runner.extend(state, ids[at:at + args.extend])
    out["prefix extension"] = (time.perf_counter() - start) * 1000.0 / args.rows
    at += args.extend
    start = time.perf_counter()
    for step in range(args.decode):
        runner.extend(states[0], [ids[at + step]])
    out["decode, 1 row"] = (time.perf_counter() - start) * 1000.0 / args.decode
    start = time.perf_counter()
    for step in range(args.decode):
        runner.extend_rows([Row(s, [ids[at + args.decode + step]]) for s in states])
    out["decode, N rows"] = (time.perf_counter() - start) * 1000.0 / args.decode
    return out


def run_runner_steps(args) -> dict:
    """Time the steps (module doc); returns the report written to --out."""
    import torch

    from headstart.engine.runner.model_runner import ModelRunner
    from headstart.models.loader import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.dtype)
    runner = ModelRunner(loaded.model, fast_path=args.fast_path)
    total = max(args.cold, args.p0 + args.extend + 2 * args.decode)
    ids = [(1000 + 37 * i) % 150000 for i in range(total)]
    p0 = runner.prefill(ids[:args.p0])
    _round(runner, ids, p0, args)  # warm: kernels, first blocks
    rounds = [_round(runner, ids, p0, args) for _ in range(args.rounds)]
    table = {name: statistics.median(r[name] for r in rounds) for name in STEPS}
    return {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "rounds": rounds, "median_ms": table}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--fast-path", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--p0", type=int, default=1000, help="tokens of the shared prefix")
    ap.add_argument("--cold", type=int, default=330, help="tokens of the cold prefill")
    ap.add_argument("--extend", type=int, default=21, help="tokens of a prefix extension")
    ap.add_argument("--decode", type=int, default=12, help="decode steps a round")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-out/runner_steps"))
    args = ap.parse_args(argv)
    if min(args.p0, args.cold, args.extend, args.decode, args.rows, args.rounds) < 1:
        ap.error("--p0, --cold, --extend, --decode, --rows and --rounds must be >= 1")
    report = run_runner_steps(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "runner_steps.json", report)
    text = (f"runner steps, {args.model} {args.dtype} ({args.threads} threads, fast path {args.fast_path}), "
            f"P0 {args.p0} tokens shared by {args.rows} rows, {args.rounds} rounds\n\n")
    text += markdown_table(["step", "ms (median of rounds)"],
                           [[name, f"{ms:.2f}"] for name, ms in report["median_ms"].items()])
    (args.out / "runner_steps.md").write_text(text + "\n")
    _plot(report, args.out / "runner_steps.png")
    print(text)


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(report["median_ms"])
    ax.barh(names, [report["median_ms"][n] for n in names])
    ax.set_xscale("log")
    ax.set_xlabel("ms (median of rounds)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
