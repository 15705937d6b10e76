"""Integration: a PyPI load tool (guidellm, the `loadtool` extra) against the
OpenAI-compatible API of the real serving stack: the model id that `/v1/models`
lists, the database in the request body (guidellm's `extras`), streamed chat
completions of a fixed length (guidellm sends `ignore_eos` and `stop: null`),
read back from guidellm's own JSON report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headstart.paths import default_tokenizer_dir
from tests.serve_fixture import SERVED_MODEL

pytestmark = pytest.mark.slow
REQUESTS = 4
OUTPUT_TOKENS = 8


def _guidellm() -> str:
    path = shutil.which("guidellm") or str(Path(sys.executable).with_name("guidellm"))
    if not Path(path).is_file():
        pytest.skip("guidellm is not installed (pip install -e .[loadtool])")
    return path


@pytest.mark.timeout(600)
def test_guidellm_runs_against_the_openai_api(serve_stack, tmp_path):
    backend = {"kind": "openai_http", "target": serve_stack.http_url, "model": SERVED_MODEL,
               "api_key": "tok-alice", "extras": {"body": {"database": "world_1"}}}
    out = tmp_path / "guidellm.json"
    proc = subprocess.run(
        [_guidellm(), "run", "--backend", json.dumps(backend), "--profile", "kind=concurrent,streams=2",
         "--constraint", f"kind=max_requests,count={REQUESTS}",
         "--data", f"kind=synthetic_text,prompt_tokens=24,output_tokens={OUTPUT_TOKENS}",
         "--tokenizer", f"kind=huggingface_auto,model={default_tokenizer_dir()}",
         "--output", f"kind=json,path={out}", "--disable-console-interactive"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    tokens = metrics["output_token_count"]["successful"]
    assert tokens["min"] == tokens["max"] == OUTPUT_TOKENS  # ignore_eos honoured: exactly the length asked
    assert metrics["time_to_first_token_ms"]["successful"]["median"] > 0
    assert metrics["inter_token_latency_ms"]["successful"]["count"] >= REQUESTS  # gaps between streamed tokens
