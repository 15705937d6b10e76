"""Issue 30: accuracy when the prompt lists a database's tables in another order than its blocks were
encoded: exact (P0 prefix cache of that prompt) vs table blocks (pfk, independent), one model load, 1 thread.

    python scripts/eval_table_order.py Pets,Has_Pet,Student rev exact,pfk,independent   (pets_1 only)

Writes out/pets-TAG-VARIANT/eval.json per variant; pair them with `headstart eval-compare`."""
import sys, time, torch
from pathlib import Path
torch.set_num_threads(1)
from headstart.build import build_runtime
from headstart.eval.compare import get_rule
from headstart.eval.dataset import load_dataset
from headstart.eval.executors import ExecLimits, build_executor
from headstart.eval.engine_generators import EngineGenerator, question_text
from headstart.eval.generator_settings import GeneratorSettings
from headstart.eval.harness import run_eval
from headstart.eval.report import write_run
from headstart.eval.summary import summarize
from headstart.tables.device_tier import DeviceTier
from headstart.tables.engine_source import use_table_service
from headstart.tables.service import TableCacheService
from headstart.tables.store import MemoryStore

ORDER = tuple(sys.argv[1].split(","))  # e.g. Pets,Has_Pet,Student
tag = sys.argv[2]
variants = sys.argv[3].split(",")  # exact,pfk,independent
MODEL = "qwen2.5-coder-0.5b-instruct"
rt = build_runtime(model=MODEL, threads=1)
settings = GeneratorSettings(model=MODEL, threads=1, max_new_tokens=256)

class Ordered(EngineGenerator):
    def _call(self, question):
        return self.runtime.complete(question.db_id, question_text(question), mode="prefix",
                                     max_new_tokens=self.settings.max_new_tokens, tables=ORDER)
    def close(self):
        pass

data = load_dataset("spider-dev", dbs=["pets_1"])
runner = build_executor("sqlite", ExecLimits(timeout_s=30.0, row_limit=100_000))
for v in variants:
    use_table_service(rt, None if v == "exact" else
                      TableCacheService(rt.loaded, mode=v, store=MemoryStore(), tier=DeviceTier(1 << 30)))
    started = time.perf_counter()
    rows = run_eval(data.questions, Ordered(rt, "prefix", settings), runner, get_rule("spider"))
    summary = summarize(rows)
    config = {"mode": f"{tag}-{v}", "dataset": "spider-dev", "model": MODEL, "dbs": ["pets_1"], "tables": list(ORDER),
              "rules": "spider", "elapsed_s": round(time.perf_counter() - started, 1)}
    write_run(Path(f"out/pets-{tag}-{v}"), config, summary, rows)
    print(v, summary["num_correct"], "/", summary["n"], flush=True)
rt.shutdown()
