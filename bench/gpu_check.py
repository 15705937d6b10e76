"""`python -m bench.gpu_check`: the benchmarks of the prepared GPU check (`scripts/gpu_check.sh`).

On a GPU (`--device cuda`, bfloat16): `bench ttft` (cold, prefix, paper and
headstart on the same typed questions: TTFT per mode, the complete answer,
one decode step) and `bench.typists` (8 and 32 typists on one engine in this
process), then one summary, gpu_check.md, with the device, the library
versions and both tables. The trained weights cannot travel to the device
machine (64 MiB a call), so the model there is a `random:` preset with the
trained model's shapes: timings are the real shapes' and answers run to the
token cap.

`--dry-run` runs the same code on the CPU with `random:tiny`, two questions
and two typists, so CI keeps the check from rotting (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import faulthandler
import platform
import sys
import time
import traceback
from pathlib import Path

from bench.common import markdown_table, write_json
from bench.gpu_floor import table as floor_table

REAL = {"model": "random:qwen2.5-coder-1.5b", "device": "cuda", "dtype": "bfloat16", "questions": 4, "wpm": 80.0,
        "max_new_tokens": 32, "typists": (8, 32), "typist_wpm": 60.0, "threads": None, "floor_steps": 24}
DRY = {"model": "random:tiny", "device": "cpu", "dtype": "float32", "questions": 2, "wpm": 600.0,
       "max_new_tokens": 4, "typists": (2,), "typist_wpm": 600.0, "threads": 2, "floor_steps": 4}
PHASES = ("ttft", "typists", "floor")


def environment(device: str) -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "gpu": gpu, "cpu": platform.processor() or platform.machine()}


def _phase(name: str, errors: dict, fn):
    """Run one phase; a failure is recorded (its traceback printed and kept in the report) so the
    other phase still runs and reports: a device lease is too short to learn one failure a run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported, then the check exits non-zero
        errors[name] = "".join(traceback.format_exception(exc))
        print(f"{name} FAILED:\n{errors[name]}", file=sys.stderr, flush=True)
        return None


def run_gpu_check(out: Path, dry_run: bool = False, model: str | None = None,
                  deadline_s: float | None = None, phases: tuple[str, ...] = PHASES, **overrides) -> dict:
    """The `phases` into `out`; the report names any phase that failed (and the call then raises).
    `deadline_s`: past it, every thread's stack is printed and the process exits, so a hang on a
    leased machine still leaves its cause in the log. `overrides`: config keys (dtype, questions)."""
    from bench.gpu_floor import run_floor_bench
    from bench.ttft import run_ttft_bench
    from bench.typists import run_typists_bench

    if unknown := set(phases) - set(PHASES):
        raise ValueError(f"unknown phases {sorted(unknown)}; valid: {', '.join(PHASES)}")
    if deadline_s:
        faulthandler.dump_traceback_later(deadline_s, exit=True)
    cfg = dict(DRY if dry_run else REAL, **{k: v for k, v in overrides.items() if v is not None})
    if model:
        cfg["model"] = model
    env = environment(cfg["device"])
    print(f"GPU check: {cfg['model']} {cfg['dtype']} on {env['gpu'] or env['cpu']}; torch {env['torch']}, "
          f"transformers {env['transformers']}", flush=True)
    if cfg["device"] == "cuda" and env["gpu"] is None:
        raise RuntimeError("no CUDA device visible to torch (run with --dry-run on a CPU)")
    started = time.perf_counter()
    errors: dict[str, str] = {}
    ttft = typists = floor = None
    if "ttft" in phases:
        ttft = _phase("ttft", errors, lambda: run_ttft_bench(
            model=cfg["model"], dbs=["world_1", "car_1"], questions=cfg["questions"], wpm=cfg["wpm"], typo_rate=0.03,
            pause=0.0, seed=0, dtype=cfg["dtype"], device=cfg["device"], threads=cfg["threads"],
            max_new_tokens=cfg["max_new_tokens"], out=out / "ttft", llamacpp="off"))
    if "typists" in phases:
        typists = _phase("typists", errors, lambda: run_typists_bench(
            out / "typists", cfg["model"], cfg["dtype"], cfg["device"], cfg["typists"], rounds=1,
            wpm=cfg["typist_wpm"], pause_s=0.3, max_new_tokens=cfg["max_new_tokens"], db="world_1", seed=0,
            threads=cfg["threads"]))
    if "floor" in phases:
        floor = _phase("floor", errors, lambda: run_floor_bench(
            out / "floor", cfg["model"], cfg["dtype"], cfg["device"], steps=cfg["floor_steps"]))
    faulthandler.cancel_dump_traceback_later()
    report = {"config": cfg, "environment": env, "seconds": time.perf_counter() - started,
              "decode_step_ms": ttft["decode_step_ms"] if ttft else None,
              "outputs_identical": ttft["outputs_identical"] if ttft else None,
              "ttft_modes": ttft["modes"] if ttft else {}, "typists": typists["rows"] if typists else [],
              "floor": floor, "phases": list(phases), "errors": errors}
    write_json(out / "gpu_check.json", report)
    text = summary(report)
    (out / "gpu_check.md").write_text(text)
    print(text, flush=True)
    if errors:
        raise RuntimeError(f"GPU check phases failed: {', '.join(errors)} (tracebacks above and in gpu_check.json)")
    return report


def summary(report: dict) -> str:
    cfg, env = report["config"], report["environment"]
    where = env["gpu"] or f"CPU ({env['cpu']})"
    head = (f"GPU check{' (dry run)' if cfg['device'] == 'cpu' else ''}: {cfg['model']} in {cfg['dtype']} on "
            f"{where}; torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}; "
            f"{report['seconds']:.0f} s\n\n")
    modes = report["ttft_modes"]
    ttft = markdown_table(["mode", "TTFT p50 ms", "TTFT p99 ms", "complete p50 ms", "answer tokens ready",
                           "answers identical to cold", "leading tokens as cold (mean)"],
                          [[m, s["p50_ms"], s["p99_ms"], s["total_p50_ms"], f"{s['answer_tokens_ready_mean']:.1f}",
                            f"{s['identical_to_cold_rate']:.0%}", f"{s['tokens_as_cold_mean']:.1f}"]
                           for m, s in modes.items()])
    typists = markdown_table(["typists", "mode", "TTFT p50 ms", "TTFT p99 ms", "complete p50 ms",
                              "decode ms / token p50"],
                             [[r["typists"], r["mode"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["total_p50_ms"],
                               "-" if r["decode_ms_per_token_p50"] is None else r["decode_ms_per_token_p50"]]
                              for r in report["typists"]])
    failed = "".join(f"**{name} failed**: {err.strip().splitlines()[-1]}\n\n"
                     for name, err in report.get("errors", {}).items())
    decode = "-" if report["decode_step_ms"] is None else f"{report['decode_step_ms']:.1f}"
    return (head + failed + f"`bench ttft` ({cfg['questions']} questions, {cfg['wpm']:g} wpm, answers capped at "
            f"{cfg['max_new_tokens']} tokens): one decode step {decode} ms; every mode's "
            f"tokens identical to cold: {report['outputs_identical']}\n\n{ttft}\n"
            f"typists on one engine (`bench.typists`, {cfg['typist_wpm']:g} wpm, 0.3 s pause):\n\n{typists}"
            + (f"\n{floor_table(report['floor'])}\n" if report.get("floor") else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on the CPU with a tiny model (CI)")
    ap.add_argument("--model", default=None, help="instead of the default random preset of the real shapes")
    ap.add_argument("--out", type=Path, default=Path("bench-out/gpu-check"))
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="past this many seconds print every thread's stack and exit (a hang's cause, logged)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--dtype", default=None, help="instead of the config's (bfloat16 on the GPU)")
    ap.add_argument("--questions", type=int, default=None, help="`bench ttft` questions (default 4)")
    args = ap.parse_args(argv)
    try:
        run_gpu_check(args.out, args.dry_run, args.model, args.deadline_s, tuple(args.phases.split(",")),
                      dtype=args.dtype, questions=args.questions)
    except (RuntimeError, ValueError) as exc:
        sys.exit(f"gpu_check: {exc}")


if __name__ == "__main__":
    main()
