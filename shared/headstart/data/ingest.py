"""A data session's rows on their way in: validation of a push, sequence
numbers, and the rows a rebuild keeps.

Sequence numbers are the caller's when it gives them (the gateway owns them:
it persists rows under its numbers before acking), else the session's own.
Either way they are strictly increasing across the session's life, so "the
seq of the newest row in the cache" names a data version, and a session
rebuilt from the same rows reaches the same version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from headstart.data.prompt import DataPrompt
from headstart.data.rows import DataRow, validate_row
from headstart.data.types import DataSettings, RowEntry
from headstart.engine.errors import InvalidInput


def validate_rows(prompt: DataPrompt, settings: DataSettings, rows: Sequence,
                  label=lambda index: f"row {index}") -> list[tuple[DataRow, list[int]]]:
    """Each raw row (`{"table": name, "values": {column: value}}`) as a
    validated `DataRow` and its line's tokens; the first bad row raises
    InvalidInput named by `label(index)`."""
    out = []
    for index, raw in enumerate(rows):
        if not isinstance(raw, dict):
            raise InvalidInput(f"{label(index)}: must be an object with 'table' and 'values'")
        try:
            row = validate_row(prompt.schema, raw.get("table"), raw.get("values"), settings.max_row_chars)
        except InvalidInput as exc:
            raise InvalidInput(f"{label(index)}: {exc.message}") from exc
        ids = prompt.row_ids(row.line)
        if len(ids) > settings.max_row_tokens:
            raise InvalidInput(f"{label(index)}: {len(ids)} tokens; the limit is {settings.max_row_tokens}")
        out.append((row, ids))
    return out


def check_seqs(seqs, count: int, last_seq: int) -> tuple[int, ...]:
    """The caller's sequence numbers for `count` rows: ints, strictly
    increasing, the first greater than `last_seq` (every seq seen so far).

    Raises:
        InvalidInput: naming the first number out of order.
    """
    if not isinstance(seqs, (list, tuple)) or len(seqs) != count:
        raise InvalidInput(f"seqs must be a list of {count} sequence numbers, one per row")
    previous = last_seq
    for index, seq in enumerate(seqs):
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidInput(f"seqs[{index}]: {seq!r} is not an integer")
        if seq <= previous:
            raise InvalidInput(f"seqs[{index}]: {seq} is not greater than {previous} "
                               "(sequence numbers must increase across the session)")
        previous = seq
    return tuple(seqs)


def rebuild_entries(prompt: DataPrompt, settings: DataSettings, rows: Iterable) -> list[RowEntry]:
    """The `(seq, row)` pairs a session is rebuilt from as entries, oldest first.

    Raises:
        InvalidInput: a pair is malformed, a row invalid, or the seqs do not increase.
    """
    pairs = list(rows)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InvalidInput(f"rebuild row {index}: must be a (seq, row) pair")
    seqs = check_seqs([seq for seq, _ in pairs], len(pairs), 0)
    checked = validate_rows(prompt, settings, [raw for _, raw in pairs],
                            label=lambda index: f"rebuild row seq {seqs[index]}")
    return [RowEntry(seq, row, ids) for seq, (row, ids) in zip(seqs, checked)]


def retained_start(entries: Sequence[RowEntry], bound: int) -> int:
    """Index of the oldest row kept under `bound` tokens: the longest suffix
    that fits, which is what retention leaves after any history of batches
    (each retention drops the fewest oldest rows that make the rest fit, and
    appending rows only moves that cut later)."""
    tokens, start = 0, len(entries)
    while start > 0 and tokens + len(entries[start - 1].ids) <= bound:
        start -= 1
        tokens += len(entries[start].ids)
    return start
