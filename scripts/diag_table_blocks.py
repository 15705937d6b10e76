"""Where each table block sits and how far an assembled P0 drifts from the prefill's.

    python scripts/diag_table_blocks.py [--model M] [DB ...]   (default pets_1 concert_singer car_1)

For each database and table-cache mode: the encode groups, each block's span in
the whole-schema prompt vs where it was encoded (and after which tables), and
the largest |K| and |V| difference from a plain prefill over that span, the
tail's and the last logits'. One CPU thread. A block placed where and after
what it was encoded differs only by rounding (issue 30).
"""
import argparse
import time

import torch
torch.set_num_threads(1)
from headstart.build import build_runtime
from headstart.tables.service import TableCacheService
from headstart.tables.device_tier import DeviceTier
from headstart.tables.store import MemoryStore

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
parser.add_argument("dbs", nargs="*", default=["pets_1", "concert_singer", "car_1"])
args = parser.parse_args()
rt = build_runtime(model=args.model, threads=1)
loaded = rt.loaded
dbs = args.dbs

def spans_diff(a, b, lo, hi):
    dk = max(float((x.keys[..., lo:hi, :] - y.keys[..., lo:hi, :]).abs().max()) for x, y in zip(a.cache.layers, b.cache.layers))
    dv = max(float((x.values[..., lo:hi, :] - y.values[..., lo:hi, :]).abs().max()) for x, y in zip(a.cache.layers, b.cache.layers))
    return dk, dv

for db in dbs:
    prompt = rt.prompt_for(db)
    ref = rt.runner.prefill(prompt.base_ids)
    for mode in ("pfk", "independent"):
        svc = TableCacheService(loaded, mode=mode, store=MemoryStore(), tier=DeviceTier(1 << 30))
        layout = svc.layout(db, prompt)
        t0 = time.perf_counter()
        svc.precompute(layout, rt.runner)
        encode_s = time.perf_counter() - t0
        blocks = svc.load(svc.plan(layout, prompt.base_ids))
        state, stats = svc.assemble(blocks, rt.runner, compute_tail=True)
        print(f"== {db} {mode}: head {len(layout.head_ids)} tok, groups (encode order) {layout.groups}; P0 {len(prompt.base_ids)} tok; precompute {encode_s:.2f} s")
        for p in blocks.placed:
            b = p.block
            dk, dv = spans_diff(state, ref, p.start, p.end)
            print(f"   {b.table:18s} prompt pos [{p.start},{p.end})  encoded at [{b.position_offset},{b.position_offset + b.num_tokens}) "
                  f"after {list(b.group_tables[:b.group_tables.index(b.table)])}  max|dK|={dk:.3g} max|dV|={dv:.3g}")
        tail = blocks.placed[-1].end
        dk, dv = spans_diff(state, ref, tail, len(prompt.base_ids))
        dl = float((state.last_logits - ref.last_logits).abs().max())
        print(f"   tail [{tail},{len(prompt.base_ids)}) max|dK|={dk:.3g} max|dV|={dv:.3g}; last logits max diff {dl:.3g}; "
              f"argmax {int(state.last_logits.argmax())} vs {int(ref.last_logits.argmax())}")
        svc.release(blocks)
rt.shutdown()
