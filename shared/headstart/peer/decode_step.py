"""One llama.cpp decode step on a warm cache, and its greedy tokens, in-process.

Run as `python -m headstart.peer.decode_step --gguf F --threads T --ids '[..]'`
in a process of its own (so llama.cpp's and torch's thread pools never share a
process). Prints one JSON object: the median ms of a one-token forward after
the prompt is evaluated, and the greedy tokens (argmax of the logits, no
sampler), for the exactness check against our engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def greedy_and_step(gguf: Path, ids: list[int], threads: int, new_tokens: int, n_ctx: int = 4096) -> dict:
    """Evaluate `ids`, then decode `new_tokens` greedily; time each one-token step."""
    import numpy as np
    from llama_cpp import Llama

    # K and V in f32 (GGML_TYPE_F32 = 0), as ours; flash attention off (its default; f16 on CPU)
    llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                logits_all=False, verbose=False, type_k=0, type_v=0, flash_attn=False)
    started = time.perf_counter()
    llm.eval(ids)
    prefill_ms = (time.perf_counter() - started) * 1000.0
    vocab = llm.n_vocab()

    def last_logits():
        # NOTE: with logits_all off, Llama.eval no longer fills `scores`; read the
        # context's logits of the batch's last position directly.
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))

    tokens, steps = [], []
    for _ in range(new_tokens):
        token = int(np.argmax(last_logits()))
        tokens.append(token)
        started = time.perf_counter()
        llm.eval([token])
        steps.append((time.perf_counter() - started) * 1000.0)
    return {"tokens": tokens, "decode_step_ms": statistics.median(steps), "prefill_ms": prefill_ms,
            "prompt_tokens": len(ids), "threads": threads}


def run_in_subprocess(gguf: Path, ids: list[int], threads: int, new_tokens: int = 12, timeout_s: float = 600) -> dict:
    """`greedy_and_step` in a fresh Python process (see module doc)."""
    done = subprocess.run([sys.executable, "-m", "headstart.peer.decode_step", "--gguf", str(gguf),
                           "--threads", str(threads), "--new-tokens", str(new_tokens), "--ids", json.dumps(ids)],
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp decode step failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--ids", required=True, help="prompt token ids, a JSON list")
    args = parser.parse_args()
    print(json.dumps(greedy_and_step(args.gguf, json.loads(args.ids), args.threads, args.new_tokens)))


if __name__ == "__main__":
    main()
