"""Where and why llama.cpp's greedy text leaves ours on the same weights.

`python -m bench.peer_divergence --model random:qwen2.5-coder-0.5b --db car_1 --question "..."`
asks a running-here C++ `llama-server` (one per KV cache type, f16 = its
default and f32 = ours) for the greedy tokens of our rendered prompt with
the top-2 log-probabilities of every step (`n_probs`, before sampling: a
log-probability gap is the logit gap), and computes ours in float32 and
float64 over the same tokens. At the first step where the tokens differ it
prints both engines' top-2 logit gap: a gap of ~1e-3 that flips is a
near-tie decided by rounding (f16 K/V, summation order), not a bug;
different prompt tokens or a large gap would be one. Prints JSON.
"""

from __future__ import annotations

import argparse
import json

import httpx
import torch

from bench.peer_llamacpp import prompt_text


def llama_steps(url: str, prompt: str, n: int) -> list[dict]:
    """llama-server's greedy tokens with the top-2 (token, logprob) of each step."""
    # NOTE: the penalties said explicitly: the GGUF carries the model's generation_config defaults
    # (repetition_penalty 1.05 for Qwen2.5), which llama-server applies to requests that do not
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "n_probs": 2, "cache_prompt": False,
            "return_tokens": True, "post_sampling_probs": False, "repeat_penalty": 1.0, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "dry_multiplier": 0.0}
    r = httpx.post(f"{url}/completion", json=body, timeout=600.0)
    r.raise_for_status()
    out = []
    for token, step in zip(r.json()["tokens"], r.json()["completion_probabilities"]):
        top = step["top_logprobs"]
        out.append({"token": token, "top2": [(t["id"], t["logprob"]) for t in top[:2]],
                    "gap": top[0]["logprob"] - top[1]["logprob"]})
    return out


def our_steps(model, prompt_ids: list[int], tokens: list[int]) -> list[dict]:
    """Our greedy choice and top-2 logit gap at each step, teacher-forced on `tokens` (model's dtype)."""
    # NOTE: a deliberate reference, not a product path: the Hugging Face model's own forward over the
    # whole sequence, no cache and no kernels of ours, beside llama.cpp's (the engine's path is `engine_cold`)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1:]
    out = []
    for row in logits[: len(tokens)]:
        top = torch.topk(row.double(), 2)
        out.append({"token": int(top.indices[0]), "top2": [(int(i), float(v)) for i, v in zip(top.indices, top.values)],
                    "gap": float(top.values[0] - top.values[1])})
    return out


def compare(runtime, model64, db: str, question: str, n: int, servers: dict[str, str]) -> dict:
    """One question: our tokens and gaps (float32, float64) beside each llama-server's."""
    builder = runtime.prompt_for(db)
    ids, text = builder.prompt_ids(question), prompt_text(builder, question)
    report = {"question": question, "db": db, "prompt_tokens": len(ids)}
    greedy = []
    with torch.no_grad():  # our greedy tokens (float32), the reference: the model's own forward, as in `our_steps`
        seq = list(ids)
        for _ in range(n):
            token = int(runtime.loaded.model(torch.tensor([seq])).logits[0, -1].argmax())
            greedy.append(token)
            seq.append(token)
    ours32 = our_steps(runtime.loaded.model, ids, greedy)
    ours64 = our_steps(model64, ids, greedy)
    engine_cold = list(runtime.complete(db, question, "cold", n).token_ids)  # what bench ttft calls cold
    report["ours"] = {"tokens": greedy, "text": builder.decode(greedy), "engine_cold_same": engine_cold == greedy[:len(engine_cold)],
                      "float64_same_tokens": [s["token"] for s in ours64] == greedy}
    for name, url in servers.items():
        theirs = llama_steps(url, text, n)
        tokens = [s["token"] for s in theirs]
        first = next((k for k, (a, b) in enumerate(zip(tokens, greedy)) if a != b), None)
        entry = {"tokens": tokens, "text": builder.decode(tokens), "same_as_ours": tokens == greedy,
                 "first_differing_step": first}
        if first is not None:
            entry["at_first_difference"] = {
                "llamacpp_top2": theirs[first]["top2"], "llamacpp_gap": theirs[first]["gap"],
                "ours_float32_top2": ours32[first]["top2"], "ours_float32_gap": ours32[first]["gap"],
                "ours_float64_top2": ours64[first]["top2"], "ours_float64_gap": ours64[first]["gap"]}
        entry["min_gap_llamacpp"] = min(s["gap"] for s in theirs)
        report[name] = entry
    report["ours"]["min_gap_float32"] = min(s["gap"] for s in ours32)
    return report


def main() -> None:
    import copy

    from headstart.engine.runtime import EngineRuntime
    from headstart.peer.llama_server_cpp import LlamaServerCpp

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="random:qwen2.5-coder-0.5b")
    parser.add_argument("--db", default="car_1")
    parser.add_argument("--question", action="append", required=True)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    servers = {f"llamacpp_kv_{t}": LlamaServerCpp(args.model, threads=args.threads, cache_type=t) for t in ("f16", "f32")}
    runtime = EngineRuntime.from_settings(model=args.model, dtype="float32", threads=args.threads,
                                          p0_cache_on_disk=False)
    model64 = copy.deepcopy(runtime.loaded.model).to(torch.float64)
    try:
        for s in servers.values():
            s.start()
        for q in args.question:
            print(json.dumps(compare(runtime, model64, args.db, q, args.new_tokens,
                                     {k: s.url for k, s in servers.items()}), indent=1), flush=True)
    finally:
        for s in servers.values():
            s.stop()
        runtime.shutdown()


if __name__ == "__main__":
    main()
