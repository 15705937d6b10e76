"""llama.cpp's C++ `llama-server` as the peer: built by `headstart peer build-server`,
it gives our greedy tokens on the same weights and serves requests at once in
its parallel slots, and the benches' llamacpp rows run on it.

The tests that need the binary skip without it (CI does not build it: many
minutes of C++); the paths without it (clear errors) are tested everywhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from headstart.peer.server_build import find_llama_server

HAS_SERVER = find_llama_server() is not None
# the random weights these tests serve are converted to GGUF by llama.cpp's converter (the `peer` extra)
HAS_CONVERTER = importlib.util.find_spec("sentencepiece") is not None
needs_server = pytest.mark.skipif(not (HAS_SERVER and HAS_CONVERTER),
                                  reason="llama-server (C++) is not built (headstart peer build-server) or the peer "
                                         "extra's converter dependencies are missing")
# The GGUF carries the model's generation_config (repetition_penalty 1.05), which llama-server applies
# by default: greedy means saying no penalties (as the benches' OpenAI requests do).
NO_PENALTIES = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "dry_multiplier": 0.0}
PROMPTS = ["How many singers are there?", "List the names of all countries in Europe, sorted by population.",
           "what is the average   age of\tteachers?"]


@pytest.fixture
def run_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def tiny():
    """Our engine on random:tiny float32, and concert_singer's prompt builder."""
    from headstart.engine.runtime import EngineRuntime

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_on_disk=False)
    yield runtime, runtime.prompt_for("concert_singer")
    runtime.shutdown()


def _our_greedy(loaded, ids: list[int], new_tokens: int) -> list[int]:
    out, ids = [], list(ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            token = int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out


def _native_completion(url: str, prompt: str, n: int, **extra) -> dict:
    """llama-server's own /completion: greedy, the generated token ids returned."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "return_tokens": True, "cache_prompt": True,
            "ignore_eos": True, **NO_PENALTIES, **extra}
    r = httpx.post(f"{url}/completion", json=body, timeout=300.0)
    r.raise_for_status()
    return r.json()


@needs_server
def test_cpp_server_gives_our_greedy_tokens_and_reuses_the_prompt_prefix(run_home, tiny):
    from bench.peer_llamacpp import prompt_text, same_prompt_tokens, warm_slots
    from headstart.peer.llama_server_cpp import LlamaServerCpp
    from headstart.peer.openai_stream import stream_completion

    runtime, builder = tiny
    server = LlamaServerCpp("random:tiny", parallel=1, threads=2)
    assert server.gguf.is_relative_to(run_home)
    try:
        server.start()
        warm_slots(server, prompt_text(builder, "warm up"))
        for question in PROMPTS:
            ids = builder.prompt_ids(question)
            assert same_prompt_tokens(server, builder, question)
            ours = _our_greedy(runtime.loaded, ids, 8)
            assert _native_completion(server.url, prompt_text(builder, question), 8)["tokens"] == ours, question
        # the OpenAI endpoint the benches use: same text, and the schema prefix came from the slot's cache
        timing = stream_completion(server.url, prompt_text(builder, PROMPTS[0]), 6)
        assert not timing.error and timing.text == builder.decode(_our_greedy(runtime.loaded,
                                                                              builder.prompt_ids(PROMPTS[0]), 6))
        assert timing.prompt_tokens == len(builder.prompt_ids(PROMPTS[0]))
        assert 0 < timing.computed_prompt_tokens < len(builder.prompt_ids(PROMPTS[0])) // 2
        assert timing.server_timings["predicted_n"] == 6
    finally:
        server.stop()
    assert server.proc.poll() is not None


@needs_server
def test_cpp_server_serves_two_requests_at_once_in_two_slots(run_home, tiny):
    """Request B is answered while A is still streaming: its first and last token arrive before A's
    last (a one-request-at-a-time server would answer B only after A's last token); both answers are
    still our greedy tokens (batched decoding does not change them here)."""
    from bench.peer_llamacpp import prompt_text
    from headstart.peer.llama_server_cpp import LlamaServerCpp
    from headstart.peer.openai_stream import stream_completion

    runtime, builder = tiny
    server = LlamaServerCpp("random:tiny", parallel=2, threads=2)
    events: dict[str, float] = {}
    try:
        server.start()
        a_prompt, b_prompt = prompt_text(builder, PROMPTS[1]), prompt_text(builder, PROMPTS[0])
        long_n = 1500  # A: long enough that B, started after A's first token, overlaps it
        a_result: dict = {}

        def run_a():
            body = {"prompt": a_prompt, "n_predict": long_n, "temperature": 0.0, "ignore_eos": True,
                    "stream": True, "return_tokens": True, **NO_PENALTIES}
            tokens = []
            with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        chunk = json.loads(line[5:])
                        tokens += chunk.get("tokens", [])
                        events.setdefault("a_first", time.monotonic())
                        a_result["slot"] = chunk.get("id_slot", a_result.get("slot"))
            events["a_last"] = time.monotonic()
            a_result["tokens"] = tokens

        thread = threading.Thread(target=run_a)
        thread.start()
        while "a_first" not in events and thread.is_alive():
            time.sleep(0.005)
        b = _native_completion(server.url, b_prompt, 4)
        events["b_last"] = time.monotonic()
        thread.join()
        assert "a_last" in events and events["b_last"] < events["a_last"], "B waited for A: no parallel slots"
        assert b["id_slot"] != a_result["slot"]
        assert b["tokens"] == _our_greedy(runtime.loaded, builder.prompt_ids(PROMPTS[0]), 4)
        assert a_result["tokens"][:8] == _our_greedy(runtime.loaded, builder.prompt_ids(PROMPTS[1]), 8)
        assert len(a_result["tokens"]) == long_n
        # bench serve's llamacpp round on it: two typists at once, nothing fails, the prefix was reused
        from bench.serve import summarize
        from bench.serve_llamacpp import PeerRows, llamacpp_round
        from headstart.typist import Typist

        rows = PeerRows(server, builder, say=lambda *_: None)
        assert rows.at(2) is server  # -np 2 already: not restarted
        samples = asyncio.run(llamacpp_round(server, builder, 2, PROMPTS, 0, 1, Typist(wpm=3000), 4))
        stats = summarize(samples, [])
        assert stats["num_errors"] == 0 and stats["ttft_p50_ms"] > 0 and stats["client_total_p99_ms"] > 0
        assert 0 < stats["computed_at_submit_mean"] < min(s.prompt_tokens for s in samples)
        # at another N it is restarted with that many slots
        restarted = rows.at(3)
        assert restarted is not server and restarted.parallel == 3 and server.proc.poll() is not None
        assert "-np 3" in restarted.describe() and httpx.get(f"{restarted.url}/health").status_code == 200
        rows.stop()
        assert restarted.proc.poll() is not None
    finally:
        server.stop()


def test_peer_server_choices_are_checked(run_home, monkeypatch):
    from headstart.peer.gguf_convert import PeerUnavailable
    from headstart.peer.llama_server_cpp import LlamaServerCpp, peer_server

    with pytest.raises(ValueError, match="auto, cpp, python"):
        peer_server("random:tiny", server="rust")
    monkeypatch.setenv("HEADSTART_LLAMA_SERVER", str(run_home / "no-such-binary"))
    assert find_llama_server() is None
    with pytest.raises(PeerUnavailable, match="headstart peer build-server"):
        peer_server("random:tiny", server="cpp")
    with pytest.raises(ValueError, match="parallel"):
        LlamaServerCpp("random:tiny", parallel=0)
    with pytest.raises(ValueError, match="KV cache type"):
        LlamaServerCpp("random:tiny", cache_type="q8_0")


def test_cpp_server_command_sets_slots_context_cache_and_threads(run_home, tmp_path):
    from headstart.peer.llama_server_cpp import LlamaServerCpp

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    binary = tmp_path / "llama-server"
    server = LlamaServerCpp(str(gguf), parallel=4, threads=3, ctx_per_slot=1024, binary=binary, port=1234,
                            cache_type="f32")
    cmd = server.command()
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert cmd[0] == str(binary) and flag("--model") == str(gguf) and flag("--port") == "1234"
    assert flag("--parallel") == "4" and flag("--ctx-size") == "4096" and "--no-kv-unified" in cmd
    assert flag("--threads") == flag("--threads-batch") == "3"
    assert "--cont-batching" in cmd and "--cache-prompt" in cmd and flag("--cache-reuse") == "0"
    assert flag("--cache-type-k") == flag("--cache-type-v") == "f32" and flag("--flash-attn") == "off"
    f16 = LlamaServerCpp(str(gguf), cache_type="f16", binary=binary).command()
    assert f16[f16.index("--flash-attn") + 1] == "auto" and f16[f16.index("--cache-type-k") + 1] == "f16"
    # a trained GGUF (a user's file, a catalogue model): llama.cpp's own defaults, no attention flags
    defaults = LlamaServerCpp(str(gguf), binary=binary).command()
    assert "--cache-type-k" not in defaults and "--flash-attn" not in defaults
    assert server.describe() == "llama-server (C++) -np 4"


def test_build_without_cmake_is_a_clear_error(run_home, tmp_path):
    """`headstart peer build-server` on a PATH without cmake: exit 2 and what to install, no traceback."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "HEADSTART_HOME": str(run_home), "PATH": str(empty)}
    proc = subprocess.run([sys.executable, "-m", "cli", "peer", "build-server"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "cmake" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((run_home / "peer").glob("llama-server-*"))  # nothing fetched or configured


def test_serve_table_gives_ratios_to_llamacpp_at_the_same_n():
    from bench.serve import table

    base = {"engine_ttft_p50_ms": None, "total_p50_ms": None, "computed_at_submit_mean": None,
            "keystroke_rtt_p50_ms": None, "keystroke_rtt_p99_ms": None, "num_errors": 0, "client_total_p99_ms": 1.0}
    rows = [{**base, "mode": "anticipatory", "path": "grpc", "n": 4, "ttft_p50_ms": 50.0, "ttft_p99_ms": 90.0,
             "client_total_p50_ms": 300.0},
            {**base, "mode": "llamacpp", "path": "openai", "n": 4, "ttft_p50_ms": 200.0, "ttft_p99_ms": 400.0,
             "client_total_p50_ms": 600.0, "server": "llama-server (C++) -np 4"},
            {**base, "mode": "prefix", "path": "grpc", "n": 8, "ttft_p50_ms": 70.0, "ttft_p99_ms": 90.0,
             "client_total_p50_ms": 300.0},
            {**base, "mode": "anticipatory", "path": "grpc", "n": 8, "ttft_p50_ms": 5.0, "ttft_p99_ms": 9.0,
             "client_total_p50_ms": 240.0, "answer_tokens_at_submit_mean": 1.5}]
    text = table(rows)
    # no prefix row at N=4: no ratio to it
    assert "| anticipatory | grpc | 4 | 50.0 | 90.0 | - | - | 300.0 | 1.0 | - | 0.25 | 0.50 | - | - |" in text
    assert "| llamacpp (llama-server (C++) -np 4) | openai | 4 |" in text
    assert "| prefix | grpc | 8 | 70.0 | 90.0 | - | - | 300.0 | 1.0 | - | - | - |" in text  # no peer row at N=8
    # against prefix caching on the same path and N; with the answer tokens decoded ahead
    assert "| anticipatory | grpc | 8 | 5.0 | 9.0 | - | - | 240.0 | 1.0 | 0.80 | - | - | - | 1.5 |" in text


def test_a_native_build_keeps_amx_off_on_a_cpu_that_lists_it():
    from headstart.peer.server_build import NO_AMX_FLAGS, native_flags

    flags = native_flags({"fpu", "avx2", "avx512f", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"})
    assert f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}" in flags and f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}" in flags
    assert native_flags({"fpu", "avx2", "avx512f", "avx512_vnni"}) == []  # nothing to keep off
