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

# a sitecustomize that makes the device's missing packages unimportable in the check's process
BLOCKER = '''
import sys
MISSING = {"ray", "redis", "fastapi", "starlette", "uvicorn", "websockets", "locust"}
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r} (the GPU machine has none)", name=name)
        return None
sys.meta_path.insert(0, _Missing())
'''


def test_gpu_check_dry_run_without_server_packages(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(site), HEADSTART_HOME=str(tmp_path / "home"))
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "dry-run", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["config"]["model"] == "random:tiny" and report["environment"]["device"] == "cpu"
    assert set(report["ttft_modes"]) == {"cold", "prefix", "paper", "headstart"}
    assert report["outputs_identical"] is True  # every mode's tokens are cold's, in the check too
    assert {(r["typists"], r["mode"]) for r in report["typists"]} == {(2, "anticipatory"), (2, "prefix")}
    assert all(r["n"] == 2 for r in report["typists"])
    text = (out / "gpu_check.md").read_text()
    assert text.startswith("GPU check (dry run): random:tiny") and "| headstart |" in text
    assert (out / "typists" / "typists.png").stat().st_size > 0 and (out / "ttft" / "ttft.json").is_file()


def test_gpu_check_names_its_steps_on_a_wrong_one():
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "bogus"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "prepare | run [OUT] | dry-run [OUT]" in done.stderr
