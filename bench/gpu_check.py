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
import platform
import time
from pathlib import Path

from bench.common import markdown_table, write_json

REAL = {"model": "random:qwen2.5-coder-1.5b", "device": "cuda", "dtype": "bfloat16", "questions": 4, "wpm": 80.0,
        "max_new_tokens": 32, "typists": (8, 32), "typist_wpm": 60.0, "threads": None}
DRY = {"model": "random:tiny", "device": "cpu", "dtype": "float32", "questions": 2, "wpm": 600.0,
       "max_new_tokens": 4, "typists": (2,), "typist_wpm": 600.0, "threads": 2}


def environment(device: str) -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "gpu": gpu, "cpu": platform.processor() or platform.machine()}


def run_gpu_check(out: Path, dry_run: bool = False, model: str | None = None) -> dict:
    from bench.ttft import run_ttft_bench
    from bench.typists import run_typists_bench

    cfg = dict(DRY if dry_run else REAL)
    if model:
        cfg["model"] = model
    env = environment(cfg["device"])
    if cfg["device"] == "cuda" and env["gpu"] is None:
        raise RuntimeError("no CUDA device visible to torch (run with --dry-run on a CPU)")
    started = time.perf_counter()
    ttft = run_ttft_bench(model=cfg["model"], dbs=["world_1", "car_1"], questions=cfg["questions"], wpm=cfg["wpm"],
                          typo_rate=0.03, pause=0.0, seed=0, dtype=cfg["dtype"], device=cfg["device"],
                          threads=cfg["threads"], max_new_tokens=cfg["max_new_tokens"], out=out / "ttft",
                          llamacpp="off")
    typists = run_typists_bench(out / "typists", cfg["model"], cfg["dtype"], cfg["device"], cfg["typists"], rounds=1,
                                wpm=cfg["typist_wpm"], pause_s=0.3, max_new_tokens=cfg["max_new_tokens"],
                                db="world_1", seed=0, threads=cfg["threads"])
    report = {"config": cfg, "environment": env, "seconds": time.perf_counter() - started,
              "decode_step_ms": ttft["decode_step_ms"], "outputs_identical": ttft["outputs_identical"],
              "ttft_modes": ttft["modes"], "typists": typists["rows"]}
    write_json(out / "gpu_check.json", report)
    text = summary(report)
    (out / "gpu_check.md").write_text(text)
    print(text, flush=True)
    return report


def summary(report: dict) -> str:
    cfg, env = report["config"], report["environment"]
    where = env["gpu"] or f"CPU ({env['cpu']})"
    head = (f"GPU check{' (dry run)' if cfg['device'] == 'cpu' else ''}: {cfg['model']} in {cfg['dtype']} on "
            f"{where}; torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}; "
            f"{report['seconds']:.0f} s\n\n")
    modes = report["ttft_modes"]
    ttft = markdown_table(["mode", "TTFT p50 ms", "TTFT p99 ms", "complete p50 ms", "answer tokens ready"],
                          [[m, s["p50_ms"], s["p99_ms"], s["total_p50_ms"], f"{s['answer_tokens_ready_mean']:.1f}"]
                           for m, s in modes.items()])
    typists = markdown_table(["typists", "mode", "TTFT p50 ms", "TTFT p99 ms", "complete p50 ms",
                              "decode ms / token p50"],
                             [[r["typists"], r["mode"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["total_p50_ms"],
                               "-" if r["decode_ms_per_token_p50"] is None else r["decode_ms_per_token_p50"]]
                              for r in report["typists"]])
    return (head + f"`bench ttft` ({cfg['questions']} questions, {cfg['wpm']:g} wpm, answers capped at "
            f"{cfg['max_new_tokens']} tokens): one decode step {report['decode_step_ms']:.1f} ms; every mode's "
            f"tokens identical to cold: {report['outputs_identical']}\n\n{ttft}\n"
            f"typists on one engine (`bench.typists`, {cfg['typist_wpm']:g} wpm, 0.3 s pause):\n\n{typists}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on the CPU with a tiny model (CI)")
    ap.add_argument("--model", default=None, help="instead of the default random preset of the real shapes")
    ap.add_argument("--out", type=Path, default=Path("bench-out/gpu-check"))
    args = ap.parse_args(argv)
    run_gpu_check(args.out, args.dry_run, args.model)


if __name__ == "__main__":
    main()
