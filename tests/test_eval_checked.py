"""`headstart eval --candidates K`: every candidate run and scored, the vote, greedy vs checked side by
side, the row log holding enough to rescore any k <= K."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import headstart.eval.cli as eval_cli
from headstart.eval.checked import checked_of, checked_summary
from headstart.eval.cli import eval_command
from headstart.eval.errors import ConfigError, DatasetError
from headstart.eval.records import STATUS_SCORED, Generation, QuestionResult
from headstart.eval.rescore import rescore_command

# per question: the greedy answer, then the sampled candidates 1..4
ANSWERS = {
    "how many?": ["SELECT count(*) FROM t", "SELECT count(a) FROM t", "SELECT 7", "SELECT count(*) FROM t",
                  "SELECT nope FROM t"],
    # greedy fails; two candidates agree on the right rows, one on a wrong result
    "which a?": ["SELECT x FROM t", "SELECT a FROM t", "SELECT DISTINCT a FROM t", "SELECT DISTINCT a FROM t",
                 "SELECT b FROM t"],
    # greedy right; the wrong ones agree only from candidate 3 on
    "max a?": ["SELECT max(a) FROM t", "SELECT 9", "SELECT min(a) FROM t", "SELECT min(a) FROM t",
               "SELECT min(a) FROM t"],
}


class FakeCandidates:
    """Answers from ANSWERS, as the engine generator reports them (`extra.candidate_answers`)."""

    mode = "fake"

    def __init__(self, k: int):
        self.k = k

    def warmup(self, question) -> None:
        return None

    def generate(self, question) -> Generation:
        texts = ANSWERS[question.question]
        sampled = [{"index": i, "text": texts[i], "finish_reason": "stop", "num_tokens": 3} for i in range(1, self.k)]
        return Generation(text=texts[0], ttft_ms=1.0, extra={"candidate_answers": sampled} if self.k > 1 else {})

    def close(self) -> None:
        return None


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    db = tmp_path / "shop" / "shop.sqlite"
    db.parent.mkdir()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "x"), (1, "x"), (2, "y")])
    questions = [{"question": "how many?", "query": "SELECT count(*) FROM t", "db_id": "shop"},
                 {"question": "which a?", "query": "SELECT DISTINCT a FROM t", "db_id": "shop"},
                 {"question": "max a?", "query": "SELECT max(a) FROM t", "db_id": "shop"}]
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(questions))
    return path


def run(monkeypatch, dataset: Path, out: Path, k: int, **options) -> dict:
    monkeypatch.setattr(eval_cli, "build_generator", lambda mode, settings: FakeCandidates(settings.candidates))
    return eval_command(out=out, mode="cold", model="fake", dataset=str(dataset), db_dir=dataset.parent,
                        candidates=k, **options)


def test_checked_ex_beside_greedy(monkeypatch, dataset, tmp_path):
    summary = run(monkeypatch, dataset, tmp_path / "k5", 5)
    checked = summary["checked"]
    # greedy: right, wrong (fails), right. checked: count(*) x3 wins; DISTINCT a x2 wins; max(a)'s 1 vs min x3 loses
    assert (checked["greedy_correct"], checked["checked_correct"], checked["n"]) == (2, 2, 3)
    assert (checked["lost"], checked["gained"], checked["k"]) == (1, 1, 5)
    assert checked["oracle_correct"] == 3
    rows = json.loads((tmp_path / "k5" / "eval.json").read_text())["questions"]
    assert [c["index"] for c in rows[0]["extra"]["candidates"]] == [0, 1, 2, 3, 4]
    assert rows[0]["extra"]["candidates"][4]["key"] is None and rows[0]["extra"]["checked"]["failed"] == [4]
    assert rows[1]["extra"]["checked"] == {"k": 5, "index": 2, "correct": True, "agreed": 2, "failed": [0],
                                           "any_correct": True}
    assert "checked EX" in (tmp_path / "k5" / "eval.md").read_text()


def test_rescore_any_k_up_to_k(monkeypatch, dataset, tmp_path):
    run(monkeypatch, dataset, tmp_path / "k5", 5)
    three = rescore_command(tmp_path / "k5", "spider", tmp_path / "k3", candidates=3)["checked"]
    direct = run(monkeypatch, dataset, tmp_path / "direct3", 3)["checked"]
    assert three == direct  # K=5's first 3 are a K=3 run
    # k=3: "which a?" has two singletons that ran (a, DISTINCT a): the tie goes to the first, a (wrong);
    # "max a?" is greedy (right) vs 9 vs min: singletons, the tie goes to greedy
    assert (three["checked_correct"], three["lost"], three["gained"]) == (2, 0, 0)
    one = rescore_command(tmp_path / "k5", "spider", tmp_path / "k1", candidates=1)
    assert "checked" not in one and one["num_correct"] == 2
    with pytest.raises(DatasetError):
        rescore_command(tmp_path / "k5", "spider", tmp_path / "k9", candidates=9)


def test_a_sample_resumes_into_the_full_run(monkeypatch, dataset, tmp_path):
    out = tmp_path / "runs"
    first = run(monkeypatch, dataset, out, 3, sample=2, sample_seed=1)
    assert first["n"] == 2 and first["config"]["sample"] == 2
    seen = []
    original = FakeCandidates.generate

    def counting(self, question):
        seen.append(question.question)
        return original(self, question)

    monkeypatch.setattr(FakeCandidates, "generate", counting)
    full = run(monkeypatch, dataset, out, 3, resume=True)
    assert full["n"] == 3 and len(seen) == 1  # only the question the sample left out was generated
    with pytest.raises(ConfigError):  # other candidates: other answers, no resume
        run(monkeypatch, dataset, out, 5, resume=True)


def test_candidates_need_a_model_mode(dataset, tmp_path):
    with pytest.raises(ConfigError):
        eval_command(out=tmp_path / "g", mode="gold", dataset=str(dataset), db_dir=dataset.parent, candidates=4)


def test_vote_over_recorded_keys():
    cands = [{"index": 0, "key": None, "correct": False}, {"index": 1, "key": "A", "correct": False},
             {"index": 2, "key": "B", "correct": True}, {"index": 3, "key": "B", "correct": True}]
    assert checked_of(cands, 2)["index"] == 1  # among 0..1 only A ran
    assert checked_of(cands)["index"] == 2 and checked_of(cands)["agreed"] == 2
    assert checked_of(cands[:1]) == {"k": 1, "index": 0, "correct": False, "agreed": 0, "failed": [0],
                                     "any_correct": False}
    row = QuestionResult(0, "q0", "db", "q", "g", STATUS_SCORED, correct=False, extra={"candidates": cands})
    assert checked_summary([row], 4)["checked_correct"] == 1
    assert checked_summary([QuestionResult(1, "q1", "db", "q", "g", STATUS_SCORED, correct=True)]) is None


class LongCandidates(FakeCandidates):
    """As FakeCandidates, but the greedy answer stops after 3 tokens and "max a?"'s candidates 3 and 4
    are 20 tokens long (`bound`: what an engine with that slack reports for them instead)."""

    def __init__(self, k: int, bound: int | None = None):
        super().__init__(k)
        self.bound = bound

    def generate(self, question) -> Generation:
        gen = super().generate(question)
        for answer in gen.extra.get("candidate_answers", []):
            if question.question == "max a?" and answer["index"] >= 3:
                answer["num_tokens"] = 20
                if self.bound is not None and 20 >= self.bound:
                    answer["finish_reason"] = "bounded"
        gen.extra.update(num_tokens=3, finish_reason="stop")
        return gen


def test_rescore_bounds_the_candidates_as_the_engine_does(monkeypatch, dataset, tmp_path):
    monkeypatch.setattr(eval_cli, "build_generator", lambda mode, settings: LongCandidates(settings.candidates))
    free = eval_command(out=tmp_path / "free", mode="cold", model="fake", dataset=str(dataset),
                        db_dir=dataset.parent, candidates=5)["checked"]
    assert (free["checked_correct"], free["lost"]) == (2, 1)  # "max a?": min(a) x3 outvotes the greedy answer
    # slack 4: the bound is 3 + 4 = 7 tokens; candidates 3 and 4 of "max a?" (20) end bounded, not run
    bounded = rescore_command(tmp_path / "free", "spider", tmp_path / "slack4", length_slack=4)
    assert (bounded["checked"]["checked_correct"], bounded["checked"]["lost"]) == (3, 0)  # a tie: greedy stands
    assert bounded["config"]["candidate_length_slack"] == 4
    rows = json.loads((tmp_path / "slack4" / "eval.json").read_text())["questions"]
    assert [c["error_code"] for c in rows[2]["extra"]["candidates"][3:]] == ["bounded", "bounded"]
    # a run whose engine bounded them itself scores the same
    monkeypatch.setattr(eval_cli, "build_generator", lambda mode, settings: LongCandidates(settings.candidates, 7))
    direct = eval_command(out=tmp_path / "direct", mode="cold", model="fake", dataset=str(dataset),
                          db_dir=dataset.parent, candidates=5, candidate_length_slack=4)
    assert direct["checked"] == bounded["checked"]
    # a slack within the run's own replays; a looser one cannot (the run never decoded past its bound)
    assert rescore_command(tmp_path / "direct", "spider", tmp_path / "r2", length_slack=2)["checked"]["checked_correct"] == 3
    with pytest.raises(DatasetError):
        rescore_command(tmp_path / "direct", "spider", tmp_path / "r8", length_slack=8)
    with pytest.raises(ConfigError):
        eval_command(out=tmp_path / "bad", mode="cold", model="fake", dataset=str(dataset), db_dir=dataset.parent,
                     candidates=5, candidate_length_slack=-1)
