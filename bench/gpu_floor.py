"""`python -m bench.gpu_floor`: what one decode step costs on this device apart from our engine.

The GPU check's third phase (`bench/gpu_check.py --phases floor`). On a GPU an
eager forward of a small model is bound by kernel launches, not by the
matrix work, so the engine's decode step there is read against these floors:

- **launch**: microseconds a launch of a tiny kernel costs (N in-place adds,
  one sync): what each op of an eager forward pays at least;
- **hf dynamic**: the model's own (Hugging Face) forward, one token on a
  `DynamicCache` over a prompt, the argmax read back every step: what the
  engine runs with no kernels installed (`fast path off`), without the engine;
- **hf static**: the same on a `StaticCache` (KV preallocated, as a CUDA graph
  needs it);
- **hf static graph** (CUDA only): that step captured once in a CUDA graph and
  replayed, its input token and position written in place: the ceiling graph
  capture gives this forward;
- **runner eager, 1 row / 8 rows**: the engine's own decoder loop
  (`ModelRunner.extend_rows`, the model's modules, attention per row on its
  cache) stepping one cache, and eight at once: whether the runner's path beats
  the HF one here, and what batching the rows of a decode step gives.

Each row: the median ms of a step, and whether its greedy tokens equal hf
dynamic's (a graph that baked a position in would drift). A row that could not
run says why. Writes gpu_floor.json and gpu_floor.md to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from pathlib import Path

from bench.common import markdown_table, write_json


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def launch_us(device, launches: int = 2000) -> float:
    """Microseconds a launch of a tiny kernel costs: `launches` in-place adds and one sync."""
    import torch

    x = torch.zeros(16, device=device)
    for _ in range(50):
        x.add_(1)
    _sync(device)
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    _sync(device)
    return (time.perf_counter() - start) * 1e6 / launches


def _timed_steps(step, first_token: int, steps: int) -> tuple[list[float], list[int]]:
    """`step(token) -> next token` run `steps` times (each reads its token back): ms per step, and
    the tokens, the prefill's first among them."""
    times, tokens, token = [], [], first_token
    for _ in range(steps):
        start = time.perf_counter()
        token = step(token)
        times.append((time.perf_counter() - start) * 1000.0)
        tokens.append(token)
    return times, [first_token] + tokens


def hf_dynamic(model, prompt: list[int], steps: int) -> tuple[list[float], list[int]]:
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    first = int(out.logits[0, -1].argmax())

    def step(token: int) -> int:
        got = model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        return int(got.logits[0, -1].argmax())

    return _timed_steps(step, first, steps)


def _static_prefill(model, prompt: list[int], steps: int):
    import torch
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + steps + 8)
    out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache,
                cache_position=torch.arange(len(prompt), device=device), use_cache=True, logits_to_keep=1)
    return device, cache, int(out.logits[0, -1].argmax())


def hf_static(model, prompt: list[int], steps: int) -> tuple[list[float], list[int]]:
    import torch

    device, cache, first = _static_prefill(model, prompt, steps)
    position = [len(prompt)]

    def step(token: int) -> int:
        got = model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache,
                    cache_position=torch.tensor([position[0]], device=device), use_cache=True, logits_to_keep=1)
        position[0] += 1
        return int(got.logits[0, -1].argmax())

    return _timed_steps(step, first, steps)


def hf_static_graph(model, prompt: list[int], steps: int) -> tuple[list[float], list[int]]:
    """One decode step captured in a CUDA graph, replayed with its token and position written in place.
    The warm-up and the capture run at the first decode position, which the first replay rewrites."""
    import torch

    device, cache, first = _static_prefill(model, prompt, steps)
    if device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    token_in = torch.tensor([[first]], device=device)
    position = torch.tensor([len(prompt)], device=device)

    def forward():
        return model(input_ids=token_in, past_key_values=cache, cache_position=position, use_cache=True,
                     logits_to_keep=1).logits

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = forward()

    def step(token: int) -> int:
        token_in.fill_(token)
        graph.replay()
        position.add_(1)
        return int(logits[0, -1].argmax())

    return _timed_steps(step, first, steps)


def runner_rows(model, prompt: list[int], steps: int, rows: int = 1) -> tuple[list[float], list[int]]:
    """The engine's own decoder loop (`ModelRunner.extend_rows` with the `off` ops, in eager
    PyTorch: the model's modules, attention per row on its cache) stepping `rows` caches of the
    prompt at once: what one packed decode forward costs here, and (rows=1) whether its tokens
    are the HF step's."""
    from headstart.engine.runner.rows import Row
    from headstart.engine.runner.model_runner import ModelRunner

    runner = ModelRunner(model, fast_path="off")
    states = [runner.prefill(prompt) for _ in range(rows)]
    tokens = [int(state.last_logits.argmax()) for state in states]
    first = tokens[0]

    def step(_token: int) -> int:
        runner.extend_rows([Row(state, [token]) for state, token in zip(states, tokens)])
        tokens[:] = [int(state.last_logits.argmax()) for state in states]
        return tokens[0]

    return _timed_steps(step, first, steps)


def runner_rows_8(model, prompt: list[int], steps: int) -> tuple[list[float], list[int]]:
    return runner_rows(model, prompt, steps, rows=8)


CASES = (("hf dynamic", hf_dynamic), ("hf static", hf_static), ("hf static graph", hf_static_graph),
         ("runner eager, 1 row", runner_rows), ("runner eager, 8 rows", runner_rows_8))


def run_floor_bench(out: Path, model: str, dtype: str, device: str, prompt_tokens: int = 340,
                    steps: int = 24, seed: int = 0) -> dict:
    import torch

    from headstart.models.loader import load_model

    loaded = load_model(model, dtype=dtype, device=device, seed=seed)
    hf = loaded.model
    hf = hf.hf_view() if hasattr(hf, "hf_view") else hf
    torch_device = next(hf.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    vocab = hf.config.vocab_size
    prompt = torch.randint(100, min(vocab, 150000), (prompt_tokens,), generator=generator).tolist()
    rows = [{"case": "launch", "ms_p50": None, "us_per_launch": launch_us(torch_device), "tokens_equal": None,
             "error": None}]
    reference = None
    with torch.inference_mode():
        for name, fn in CASES:
            try:
                times, tokens = fn(hf, prompt, steps)
                _sync(torch_device)
                reference = reference or tokens
                rows.append({"case": name, "ms_p50": statistics.median(times[2:] or times), "us_per_launch": None,
                             "tokens_equal": tokens == reference, "error": None})
            except Exception as exc:  # noqa: BLE001 - a floor that cannot run says why and the others still run
                rows.append({"case": name, "ms_p50": None, "us_per_launch": None, "tokens_equal": None,
                             "error": "".join(traceback.format_exception_only(exc)).strip()[-600:]})
            print(f"  {rows[-1]}", flush=True)
    report = {"config": {"model": model, "dtype": dtype, "device": device, "prompt_tokens": prompt_tokens,
                         "steps": steps, "seed": seed}, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "gpu_floor.json", report)
    text = table(report)
    (out / "gpu_floor.md").write_text(text + "\n")
    print(text, flush=True)
    return report


def table(report: dict) -> str:
    c = report["config"]
    head = (f"one decode step apart from the engine: {c['model']} {c['dtype']} on {c['device']}, "
            f"{c['prompt_tokens']}-token prompt, median of {c['steps']} steps\n\n")
    return head + markdown_table(
        ["case", "ms per step p50", "us per launch", "tokens equal to hf dynamic", "why not run"],
        [[r["case"], "-" if r["ms_p50"] is None else f"{r['ms_p50']:.2f}",
          "-" if r["us_per_launch"] is None else f"{r['us_per_launch']:.1f}",
          "-" if r["tokens_equal"] is None else r["tokens_equal"], (r["error"] or "").replace("|", "/")]
         for r in report["rows"]])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompt-tokens", type=int, default=340)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path("bench-out/gpu-floor"))
    args = ap.parse_args(argv)
    run_floor_bench(args.out, args.model, args.dtype, args.device, args.prompt_tokens, args.steps)


if __name__ == "__main__":
    main()
