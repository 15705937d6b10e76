"""The row log: an eval run's answers on disk as they come, so a killed run can go on.

A Spider run on the real model takes an hour or more of a shared machine;
`eval.json` is written only at the end. `RowLog` appends each scored row to
`DIR/rows.jsonl` the moment it exists (one JSON object a line, flushed), so
nothing answered is lost when the run is killed. `--resume` reads it back and
asks the generator only for the questions it lacks; the final eval.json is the
union, in dataset order, as if the run had never stopped.

The file's lines:
- `{"run": {...}}` first: the settings that decide the answers (mode, model,
  dataset, rules, ...). A resume with other settings is refused: mixing two
  configurations in one table would be a wrong number, not a missing one.
- `{"segment": k, "row": {...}, "t": s}` for each question: `t` is the
  seconds since segment k began (the run's time is the sum of its segments).
- `{"finished": true}` last, once eval.json is written. A new run into a
  folder whose log is unfinished must say `--resume` (or go elsewhere): a run
  never silently throws away answers a killed run left.
A last line cut off mid-write (the process was killed there) is ignored.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headstart.eval.errors import ConfigError, DatasetError
from headstart.eval.records import QuestionResult

ROW_LOG = "rows.jsonl"


@dataclass
class LoggedRun:
    """What a row log holds: its settings, rows by dataset index, time spent, whether it finished."""

    settings: dict[str, Any]
    rows: dict[int, QuestionResult] = field(default_factory=dict)
    segments: int = 0
    elapsed_s: float = 0.0
    finished: bool = False


def read_row_log(path: Path) -> LoggedRun | None:
    """The log at `path` (a run folder or the file), or None when there is none.

    DatasetError when the file is not a row log.
    """
    path = path / ROW_LOG if path.is_dir() else path
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("run"), dict):
        raise DatasetError(f"{path} is not a headstart row log (its first line names no run)")
    logged = LoggedRun(settings=head["run"])
    segment_time: dict[int, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # killed mid-write: the last line is cut off
                break
            raise DatasetError(f"{path}:{number} is not JSON") from None
        if entry.get("finished"):
            logged.finished = True
        elif "row" in entry:
            row = QuestionResult(**entry["row"])
            logged.rows[row.index] = row
            segment = int(entry.get("segment", 0))
            segment_time[segment] = max(segment_time.get(segment, 0.0), float(entry.get("t", 0.0)))
    logged.segments = max(segment_time, default=-1) + 1
    logged.elapsed_s = sum(segment_time.values())
    return logged


class RowLog:
    """Appends one run's rows to DIR/rows.jsonl as they are scored (see the module docstring)."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], *, resume: bool) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / ROW_LOG
        self.settings = _plain(settings)
        previous = read_row_log(self.path)
        self.previous = LoggedRun(settings=self.settings)
        if previous is not None and resume:
            if previous.settings != self.settings:
                changed = sorted(k for k in set(previous.settings) | set(self.settings)
                                 if previous.settings.get(k) != self.settings.get(k))
                raise ConfigError(
                    f"{self.path} was written with other settings ({', '.join(changed)} differ); "
                    "resume with the same options, or use another --out")
            self.previous = previous
        elif previous is not None and not previous.finished and previous.rows:
            raise ConfigError(
                f"{self.path} holds {len(previous.rows)} answers of an unfinished run: "
                "--resume goes on from them; another --out (or deleting the file) starts over")
        self.segment = self.previous.segments
        self._started = time.perf_counter()
        fresh = not (resume and previous is not None)
        self._file = self.path.open("w" if fresh else "a", encoding="utf-8")
        if fresh:
            self._write({"run": self.settings})

    @property
    def done(self) -> dict[int, QuestionResult]:
        """The rows a resumed run already has, by dataset index (empty for a fresh run)."""
        return self.previous.rows

    def append(self, row: QuestionResult) -> None:
        """Record one scored row; it is on disk when this returns."""
        self._write({"segment": self.segment, "t": round(time.perf_counter() - self._started, 3),
                     "row": row.to_json()})

    def elapsed_s(self) -> float:
        """The run's time: the earlier segments' plus this one's so far."""
        return self.previous.elapsed_s + (time.perf_counter() - self._started)

    def finish(self) -> None:
        """Mark the run complete (after eval.json is written) and close the file."""
        if self._file.closed:
            self._file = self.path.open("a", encoding="utf-8")
        self._write({"finished": True})
        self.close()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def _write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(entry, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings as they read back from JSON (so a resume compares like with like)."""
    return json.loads(json.dumps(settings, default=str))
