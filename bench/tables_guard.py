"""The accuracy guard: how far block assembly moves the model's output from a full prefill.

Block assembly changes attention (a table sees only its own group, not every
table before it), so outputs can differ from a full prefill. For each
question:

- full: prefill the whole prompt, then decode `num_tokens` greedy tokens g;
- each table-cache mode (pfk, independent): assemble the same prompt from
  blocks, then run the model teacher-forced over g (one forward) and take
  the argmax at every position.

Reported per mode: top-1 agreement (share of the positions whose argmax
equals full's token), the first divergence (where free-running greedy
decoding from the blocks would first leave full's output), the share of
questions whose whole continuation agrees, and KL(full || mode) of the
first-token distribution (float64). On random weights these numbers mean
little; the harness runs unchanged with a real model (`--model DIR`) on a GPU.
"""

from __future__ import annotations

import statistics

import torch

from bench.common import percentile
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.engine.sched.jobs import Priority


def _greedy(runner: ModelRunner, ids: list[int], num_tokens: int, stop_ids: set[int]):
    """Full prefill, first-token logits and up to `num_tokens` greedy tokens (stops at a stop id)."""
    state = runner.prefill(ids)
    first = state.last_logits.double().cpu()
    tokens: list[int] = []
    while len(tokens) < num_tokens:
        token = int(torch.argmax(state.last_logits))
        tokens.append(token)
        if token in stop_ids or len(tokens) == num_tokens:
            break
        runner.extend(state, [token])
    return first, tokens


def _teacher_forced(runner: ModelRunner, state, tokens: list[int]) -> list[int]:
    """Argmax after the prompt and after each of tokens[:-1], the cache assembled
    from blocks (one forward of the runner, the logits of every position kept)."""
    preds = [int(torch.argmax(state.last_logits))]
    if len(tokens) > 1:
        row = Row(state, tokens[:-1], logits_positions=len(tokens) - 1)
        runner.extend_rows([row])
        preds += row.position_logits.argmax(dim=-1).tolist()
    return preds


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    log_p = torch.log_softmax(p_logits.double(), dim=-1)
    log_q = torch.log_softmax(q_logits.double().cpu(), dim=-1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def run_guard(runtime, services: dict, workload, num_tokens: int = 32) -> dict:
    """Compare full prefill with each service's assembly on `workload` (list of BenchQuestion)."""
    runner = runtime.runner
    rows = []
    for q in workload:
        prompt = runtime.prompt_for(q.db, q.tables)
        ids = prompt.prompt_ids(q.question)
        first, tokens = runtime.worker.run_sync(lambda: _greedy(runner, ids, num_tokens, runtime.stop_ids),
                                                Priority.POOL, "guard:full")
        row = {"index": q.index, "db": q.db, "num_tokens": len(tokens)}
        for mode, service in services.items():
            layout = service.layout(q.db, runtime.prompt_for(q.db))
            blocks = service.load(service.plan(layout, ids))
            try:
                def run():
                    state, _ = service.assemble(blocks, runner, compute_tail=True)
                    return state.last_logits.double().cpu(), _teacher_forced(runner, state, tokens)

                logits, preds = runtime.worker.run_sync(run, Priority.POOL, f"guard:{mode}")
            finally:
                service.release(blocks)
            agree = [p == t for p, t in zip(preds, tokens)]
            row[mode] = {
                "top1_agreement": sum(agree) / len(agree),
                "first_divergence": agree.index(False) if False in agree else len(agree),
                "kl_first_token": _kl(first, logits),
                "missing_blocks": list(blocks.missing),
            }
        rows.append(row)
        scores = (f"{m}: top1 {row[m]['top1_agreement']:.2f} KL {row[m]['kl_first_token']:.3g}" for m in services)
        print(f"  guard q{q.index} {q.db:24s} " + "  ".join(scores), flush=True)
    return {"num_questions": len(rows), "num_tokens": num_tokens,
            **{mode: _summary([r[mode] for r in rows]) for mode in services}, "per_question": rows}


def _summary(rows: list[dict]) -> dict:
    if not rows:
        return {}
    kls = [r["kl_first_token"] for r in rows]
    return {
        "top1_agreement_mean": statistics.fmean(r["top1_agreement"] for r in rows),
        "first_divergence_mean": statistics.fmean(r["first_divergence"] for r in rows),
        "whole_continuation_agrees": statistics.fmean(r["top1_agreement"] == 1.0 for r in rows),
        "kl_first_token_mean": statistics.fmean(kls),
        "kl_first_token_p50": percentile(kls, 50),
        "kl_first_token_max": max(kls),
    }
