"""llama.cpp as a peer engine: the same weights give the same greedy tokens,
and the benches' llamacpp mode runs when the `peer` extra is installed and is
skipped with a note when it is not.

The tests that need llama-cpp-python skip without it (CI does not install
the extra: it is built from source, many minutes); the skipping path is
tested there instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python (the peer extra) is not installed")
PROMPTS = ["How many singers are there?", "List the names of all countries in Europe, sorted by population.",
           "what is the average   age of\tteachers?"]


@pytest.fixture
def run_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _our_greedy(loaded, ids: list[int], new_tokens: int) -> list[int]:
    out, ids = [], list(ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            token = int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out


@needs_llama_cpp
def test_llamacpp_greedy_tokens_equal_ours_on_the_same_weights(run_home):
    from headstart.engine.runtime import EngineRuntime
    from headstart.peer.decode_step import run_in_subprocess
    from headstart.peer.gguf_convert import convert_to_gguf

    gguf = convert_to_gguf("random:tiny", "f32")
    assert gguf.is_file() and gguf.is_relative_to(run_home)
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_on_disk=False)
    try:
        builder = runtime.prompt_for("concert_singer")
        for question in PROMPTS:
            ids = builder.prompt_ids(question)
            theirs = run_in_subprocess(gguf, ids, threads=2, new_tokens=8)
            ours = _our_greedy(runtime.loaded, ids, 8)
            assert theirs["tokens"] == ours, question
            assert theirs["prompt_tokens"] == len(ids) and theirs["decode_step_ms"] > 0
        # Not a test that cannot fail: other weights give other tokens.
        other = convert_to_gguf("random:tiny", "f32", seed=1)
        assert run_in_subprocess(other, builder.prompt_ids(PROMPTS[0]), 2, 8)["tokens"] != _our_greedy(
            runtime.loaded, builder.prompt_ids(PROMPTS[0]), 8)
    finally:
        runtime.shutdown()


@needs_llama_cpp
def test_server_sees_our_prompt_tokens_and_streams_our_greedy_text(run_home):
    from bench.peer_llamacpp import prompt_text, same_prompt_tokens
    from headstart.engine.runtime import EngineRuntime
    from headstart.peer.llamacpp_server import LlamaCppServer
    from headstart.peer.openai_stream import stream_completion

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_on_disk=False)
    server = LlamaCppServer("random:tiny", threads=2)
    try:
        server.start()
        builder = runtime.prompt_for("concert_singer")
        for question in PROMPTS[:2]:
            assert same_prompt_tokens(server, builder, question)
            timing = stream_completion(server.url, prompt_text(builder, question), 6)
            assert not timing.error and timing.ttft_ms > 0 and timing.total_ms >= timing.ttft_ms
            expected = builder.decode(_our_greedy(runtime.loaded, builder.prompt_ids(question), 6))
            assert timing.text == expected
        # bench serve's llamacpp round: two typists at once (they queue in llama-cpp-python's server).
        import asyncio

        from bench.serve import summarize
        from bench.serve_llamacpp import llamacpp_round
        from headstart.typist import Typist

        samples = asyncio.run(llamacpp_round(server, builder, 2, PROMPTS, 0, 1, Typist(wpm=3000), 4))
        stats = summarize(samples, [])
        assert stats["num_errors"] == 0 and stats["ttft_p50_ms"] > 0 and stats["client_total_p50_ms"] > 0
        assert stats["engine_ttft_p50_ms"] is None and stats["computed_at_submit_mean"] is None
    finally:
        server.stop()
        runtime.shutdown()
    assert server.proc.poll() is not None  # stopped, nothing left running


def _bench_ttft(tmp_path, *extra):
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    out = tmp_path / "ttft"
    proc = subprocess.run([sys.executable, "-m", "cli", "bench", "ttft", "--model", "random:tiny", "--db",
                           "world_1", "--questions", "1", "--wpm", "3000", "--max-new-tokens", "4", "--out", str(out),
                           *extra], capture_output=True, text=True, env=env, timeout=600)
    return proc, out


@pytest.mark.skipif(HAS_LLAMA_CPP, reason="checks the behaviour without the peer extra")
def test_bench_ttft_skips_the_llamacpp_mode_with_a_note_without_the_extra(tmp_path, monkeypatch):
    from bench.peer_llamacpp import start_peer
    from bench.ttft import _report, _write

    # and without a built C++ llama-server (this checkout may have one under .headstart/peer)
    monkeypatch.setenv("HEADSTART_LLAMA_SERVER", str(tmp_path / "no-llama-server"))

    notes: list[str] = []
    assert start_peer("random:tiny", "auto", 2, say=notes.append) is None
    assert "llamacpp mode skipped" in notes[0] and "peer extra" in notes[0] and "build-server" in notes[0]
    # The report and its table without the mode (what run_ttft_bench writes then).
    rows = [{"mode": m, "ttft_ms": 5.0, "total_ms": 9.0, "computed_tokens_at_submit": 1, "wasted_tokens": 0,
             "answer_tokens_ready_at_submit": 0, "prompt_tokens": 50, "identical_to_cold": True, "num_tokens": 4}
            for m in ("cold", "prefix", "paper", "headstart")]
    report = _report(rows, 3.0, {"model": "random:tiny", "dtype": "float32", "device": "cpu", "threads": 2,
                                 "dbs": ["world_1"], "questions": 1, "wpm": 40, "typo_rate": 0, "pause": 0,
                                 "seed": 0, "max_new_tokens": 4})
    assert report["llamacpp"] is None and "llamacpp" not in report["modes"]
    _write(report, tmp_path / "ttft")
    assert "llamacpp mode: not run" in (tmp_path / "ttft" / "ttft.md").read_text()
    # Asking for it explicitly is a clear error, before any model is loaded.
    proc, _ = _bench_ttft(tmp_path, "--llamacpp", "on")
    assert proc.returncode == 2 and "peer extra" in proc.stderr and "Traceback" not in proc.stderr


@needs_llama_cpp
def test_bench_ttft_runs_the_llamacpp_mode_beside_ours(tmp_path):
    proc, out = _bench_ttft(tmp_path, "--llamacpp", "on")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "ttft.json").read_text())
    assert set(report["modes"]) == {"cold", "prefix", "paper", "headstart", "llamacpp"}
    peer = report["llamacpp"]
    assert peer["same_prompt_tokens"] and peer["same_text_as_cold"] and peer["decode_step_ms"] > 0
    text = (out / "ttft.md").read_text()
    assert "one llama.cpp decode step on the same weights" in text and f"llamacpp ran on {peer['server']}" in text
    assert "p50/llamacpp" in text and report["modes"]["llamacpp"]["p50_vs_llamacpp"] == 1.0


def test_bad_llamacpp_choice_is_a_clear_error():
    from bench.peer_llamacpp import start_peer

    with pytest.raises(ValueError, match="auto, on, off"):
        start_peer("random:tiny", "maybe", 2)
    assert start_peer("random:tiny", "off", 2) is None


def test_serve_summary_of_peer_samples_leaves_unknown_engine_fields_empty():
    from bench.serve import summarize, table
    from bench.serve_typists import Sample

    samples = [Sample("openai", False, "q", ttft_ms=t, total_ms=3 * t, client_total_ms=3 * t,
                      computed_tokens_at_submit=None) for t in (10.0, 20.0, 30.0)]
    samples.append(Sample("openai", False, "q", error="HTTP 500"))
    stats = summarize(samples, [])
    assert stats["num_errors"] == 1 and stats["ttft_p50_ms"] == 20.0 and stats["client_total_p50_ms"] == 60.0
    assert stats["engine_ttft_p50_ms"] is None and stats["computed_at_submit_mean"] is None
    row = {"mode": "llamacpp", "path": "openai", "n": 3, **stats}
    assert "| llamacpp | openai | 3 | 20.0 |" in table([row])


def test_serve_outputs_compare_every_mode_of_ours_and_leave_llamacpp_out():
    from bench.serve import output_agreement
    from bench.serve_typists import Sample

    def sample(path, anticipate, question, text, error=""):
        return dict(Sample(path, anticipate, question, text=text, error=error).as_dict(), n=1)

    samples = [sample("ws", True, "q1", "SELECT 1"), sample("grpc", False, "q1", "SELECT 1"),
               sample("openai", False, "q1", "SELECT one"),  # llama.cpp's own arithmetic: not ours
               sample("ws", True, "q2", "SELECT a"), sample("ws", False, "q2", "SELECT b"),
               sample("grpc", True, "q3", "", error="UNAVAILABLE"), sample("grpc", False, "q3", "SELECT c")]
    assert output_agreement(samples) == {"questions": 3, "identical": 2, "differing": ["q2"]}
