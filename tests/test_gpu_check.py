"""The prepared GPU check (`scripts/gpu_check.sh`, `bench/gpu_check.py`) in its CPU dry run, so it
cannot rot between the sessions that have a GPU: the same code as on the device, on random:tiny,
with the server packages the device machine lacks (Ray, the Redis client, FastAPI) made
unimportable, as they are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# on PYTHONPATH: a sitecustomize that makes the device's missing packages unimportable
BARE = ROOT / "scripts" / "gpu_bare"


def test_gpu_check_dry_run_on_the_carried_data_alone(tmp_path):
    """The dry run reads only what `prepare` carries to the device machine (`data`: the tokenizer,
    Spider's questions, schemas and two databases): ../shared is made unreachable, as it is there."""
    gpu_dir = tmp_path / "gpu"
    prepared = subprocess.run(["bash", "scripts/gpu_check.sh", "data"], cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, PYTHON=sys.executable, GPU_DIR=str(gpu_dir)), timeout=120)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    assert (gpu_dir / "shared" / "spider" / "tables.json").is_file()
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(BARE), HEADSTART_HOME=str(tmp_path / "home"),
               GPU_DIR=str(gpu_dir), HEADSTART_SHARED=str(tmp_path / "no-shared-here"))
    for name in ("HEADSTART_TOKENIZER", "HEADSTART_SPIDER_DIR"):
        env.pop(name, None)
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "dry-run", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["config"]["model"] == "random:tiny" and report["environment"]["device"] == "cpu"
    assert report["errors"] == {} and report["phases"] == ["ttft", "typists", "floor"]
    assert set(report["ttft_modes"]) == {"cold", "prefix", "paper", "headstart"}
    assert report["outputs_identical"] is True  # every mode's tokens are cold's, in the check too
    assert all(m["identical_to_cold_rate"] == 1.0 and m["tokens_as_cold_mean"] == 4 for m in report["ttft_modes"].values())
    assert {(r["typists"], r["mode"]) for r in report["typists"]} == {(2, "anticipatory"), (2, "prefix")}
    assert all(r["n"] == 2 for r in report["typists"])
    floor = {r["case"]: r for r in report["floor"]["rows"]}
    assert floor["launch"]["us_per_launch"] > 0
    assert floor["hf dynamic"]["tokens_equal"] is True and floor["hf static"]["tokens_equal"] is True
    assert "CUDA graphs need a CUDA device" in floor["hf static graph"]["error"]  # a row that cannot run says why
    assert floor["runner eager, 1 row"]["tokens_equal"] is True  # the runner's loop: the HF step's tokens
    assert floor["runner eager, 8 rows"]["ms_p50"] > 0
    text = (out / "gpu_check.md").read_text()
    assert text.startswith("GPU check (dry run): random:tiny") and "| headstart |" in text and "| hf static |" in text
    assert (out / "typists" / "typists.png").stat().st_size > 0 and (out / "ttft" / "ttft.json").is_file()


def test_gpu_check_names_its_steps_on_a_wrong_one():
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "bogus"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "prepare | data | run [DIR] | dry-run [DIR] | mimic [DIR]" in done.stderr


def test_gpu_check_refuses_an_unknown_phase():
    done = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--dry-run", "--phases", "ttft,warp"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}"))
    assert done.returncode == 1 and "unknown phases ['warp']; valid: ttft, typists, floor" in done.stderr


def test_common_prefix_counts_where_a_mode_leaves_cold():
    from bench.ttft import _common_prefix

    assert _common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert _common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert _common_prefix([5], [6]) == 0
    assert _common_prefix([1, 2], [1, 2, 3]) == 2  # one answer stopped early: the shared part


def test_gpu_check_mimic_wants_the_carried_files_first(tmp_path):
    """`mimic` runs only on what `prepare` carries: with nothing carried it says so, and builds
    no venv."""
    env = dict(os.environ, GPU_DIR=str(tmp_path / "empty"), MIMIC_VENV=str(tmp_path / "venv"))
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "mimic"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "run 'scripts/gpu_check.sh prepare' first" in done.stderr
    assert not (tmp_path / "venv").exists()
