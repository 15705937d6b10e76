"""Score Spider dev gold-vs-prediction pairs with the official evaluator and with ours.

    python scripts/check_official_spider_eval.py --official PATH/test-suite-sql-eval --out DIR \
        [--python PYTHON] [--record tests/data/spider_official_verdicts.json]

The official side is taoyds/test-suite-sql-eval's own `evaluation.evaluate()`
(`--etype exec`, default mode and `--keep_distinct`) run on a gold file and a
prediction file, in a child process with PYTHON (it needs sqlparse, nltk and
tqdm). Its per-pair verdicts are read from `eval_exec_match`, wrapped to record
what it returns; the only other change is that nltk's `word_tokenize` (used to
grade the gold's hardness, not for the verdict) is replaced by its Treebank
tokenizer, whose sentence splitter needs data that is not installed here.

Our side is `headstart.eval.harness.score_question` with `--rules
spider-official` (must agree with the default mode) and `spider` (reported
against `--keep_distinct`). Pairs: every gold query of the Spider dev
questions whose database is present, and the `sql_variants` of it (DISTINCT
dropped or added, spaced operators, changed values, a `value` placeholder,
order flipped or dropped, columns swapped, a misspelling).

Writes DIR/official_check.json and DIR/official_check.md; `--record` also
writes the official verdicts (question index, variant, verdicts: no Spider
text) for tests/test_eval_spider_official.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "shared"))

from headstart.eval.compare import get_rule  # noqa: E402
from headstart.eval.dataset import load_dataset  # noqa: E402
from headstart.eval.executors.sqlite import SqliteExecutor  # noqa: E402
from headstart.eval.harness import score_question  # noqa: E402
from headstart.eval.records import Generation  # noqa: E402
from headstart.eval.sql_variants import sql_variants  # noqa: E402

# Runs inside the child process, in the official checkout, with its own Python.
OFFICIAL_RUNNER = r"""
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
from nltk.tokenize import TreebankWordTokenizer
import process_sql
process_sql.word_tokenize = TreebankWordTokenizer().tokenize
import evaluation
verdicts = []
original = evaluation.eval_exec_match
def recording(**kwargs):
    verdict = original(**kwargs)
    verdicts.append(verdict)
    return verdict
evaluation.eval_exec_match = recording
gold, pred, db_dir, keep = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "keep"
with contextlib.redirect_stdout(io.StringIO()):
    evaluation.evaluate(gold, pred, db_dir, "exec", None, False, keep, False)
print(json.dumps(verdicts))
"""


def build_pairs(limit: int | None) -> list[dict]:
    data = load_dataset("spider-dev")
    questions = [q for q in data.questions if not q.skipped][:limit]
    return [{"question": q, "variant": name, "pred": pred}
            for q in questions for name, pred in sql_variants(q.gold_sql).items()]


def run_official(official: Path, python: str, pairs: list[dict], keep_distinct: bool) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        gold_file, pred_file = Path(tmp) / "gold.txt", Path(tmp) / "pred.txt"
        gold_file.write_text("".join(f"{' '.join(p['question'].gold_sql.split())}\t{p['question'].db_id}\n"
                                     for p in pairs))
        pred_file.write_text("".join(p["pred"] + "\n" for p in pairs))
        db_dir = str(pairs[0]["question"].db_path.parent.parent) + "/"
        out = subprocess.run([python, "-c", OFFICIAL_RUNNER, str(official), str(gold_file), str(pred_file), db_dir,
                              "keep" if keep_distinct else "default"],
                             cwd=official, check=True, capture_output=True, text=True)
    verdicts = json.loads(out.stdout.strip().splitlines()[-1])
    if len(verdicts) != len(pairs):
        raise SystemExit(f"the official evaluator scored {len(verdicts)} pairs, expected {len(pairs)}")
    return verdicts


class FixedPrediction:
    """A generator whose answer is a given prediction (the harness extracts and scores it)."""

    def __init__(self, pred: str):
        self.pred = pred

    def warmup(self, question) -> None:
        pass

    def generate(self, question) -> Generation:
        return Generation(self.pred)


def run_ours(pairs: list[dict], rules: str) -> list[int]:
    rule, executor = get_rule(rules), SqliteExecutor()
    try:
        return [int(bool(score_question(p["question"], FixedPrediction(p["pred"]), executor, rule).correct))
                for p in pairs]
    finally:
        executor.close()


def agreement(pairs: list[dict], official: list[int], ours: list[int]) -> dict:
    per_variant: dict[str, Counter] = defaultdict(Counter)
    disagreements = []
    for pair, o, h in zip(pairs, official, ours):
        per_variant[pair["variant"]].update(pairs=1, agree=int(o == h), official_right=o, ours_right=h)
        if o != h:
            q = pair["question"]
            disagreements.append({"index": q.index, "db_id": q.db_id, "variant": pair["variant"],
                                  "gold": q.gold_sql, "pred": pair["pred"], "official": o, "ours": h})
    return {"pairs": len(pairs), "agree": sum(o == h for o, h in zip(official, ours)),
            "per_variant": {k: dict(v) for k, v in sorted(per_variant.items())}, "disagreements": disagreements}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True, help="a checkout of taoyds/test-suite-sql-eval")
    parser.add_argument("--python", default=sys.executable, help="a Python with sqlparse, nltk and tqdm")
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--record", type=Path, default=None, help="write the official verdicts here")
    args = parser.parse_args()

    pairs = build_pairs(args.limit)
    print(f"{len(pairs)} pairs from {len({p['question'].index for p in pairs})} questions", flush=True)
    official = {mode: run_official(args.official, args.python, pairs, mode == "keep_distinct")
                for mode in ("default", "keep_distinct")}
    ours = {rules: run_ours(pairs, rules) for rules in ("spider-official", "spider")}
    report = {
        "spider-official vs official default": agreement(pairs, official["default"], ours["spider-official"]),
        "spider vs official --keep_distinct": agreement(pairs, official["keep_distinct"], ours["spider"]),
        "official default vs --keep_distinct": agreement(pairs, official["default"], official["keep_distinct"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "official_check.json").write_text(json.dumps(report, indent=1))
    lines = ["| comparison | pairs | agree | disagree |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['pairs']} | {r['agree']} | {r['pairs'] - r['agree']} |" for name, r in report.items()]
    lines += ["", "| variant | pairs | official default right | official --keep_distinct right |", "|---|---|---|---|"]
    default_v, keep_v = report["spider-official vs official default"]["per_variant"], \
        report["spider vs official --keep_distinct"]["per_variant"]
    lines += [f"| {k} | {v['pairs']} | {v['official_right']} | {keep_v[k]['official_right']} |"
              for k, v in default_v.items()]
    (args.out / "official_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.record is not None:
        verdicts: dict[str, dict[str, str]] = defaultdict(dict)
        for pair, d, k in zip(pairs, official["default"], official["keep_distinct"]):
            verdicts[str(pair["question"].index)][pair["variant"]] = f"{d}{k}"
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps({
            "source": "taoyds/test-suite-sql-eval (Apache-2.0) evaluation.evaluate --etype exec, commit e97acc5",
            "format": "question index in spider-dev -> variant (headstart.eval.sql_variants) -> "
                      "'<default verdict><keep_distinct verdict>'",
            "verdicts": verdicts}, separators=(",", ":"), sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
