"""Pull the SQL out of a model's answer.

Models wrap SQL in code fences (with or without a language tag), put prose
before or after it, write several statements, or leave chat-template tokens
such as `<|im_end|>` behind. `extract_sql` returns the first SQL statement it
finds, without a trailing semicolon; when nothing looks like SQL it returns the
stripped text, so the failure stays visible in the report.
"""

from __future__ import annotations

import re

# A chat model's end-of-turn markers: everything after one is not the answer.
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>")
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>(?:assistant|user|system)?\n?", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_INLINE = re.compile(r"`((?:SELECT|WITH)\b[^`]*)`", re.IGNORECASE)
_SQL_LANGS = {"sql", "sqlite", "postgresql", "postgres", "psql", "mysql", "tsql", ""}
_START_AT_LINE = re.compile(r"(?im)^[ \t]*(?:sql[ \t]*:[ \t]*)?((?:select|with)\b)")
_START_UPPER = re.compile(r"\b(SELECT|WITH)\b")
# Any case: SELECT, or WITH opening a CTE (prose says "with" a lot).
_QUERY_WORD = re.compile(r"(?i)\b(select\b|with\s+(?:recursive\s+)?\w+\s*(?:\([^)]*\)\s*)?as\s*\()")
_START_ANY = _QUERY_WORD
# A query word right after one of these (and any opening parentheses) starts
# the second half of a compound query, never a whole statement.
_COMPOUND_BEFORE = re.compile(r"(?i)\b(?:union(?:\s+all)?|intersect|except)[\s(]*\Z")
# A line that starts like prose (or markdown) ends the SQL when no semicolon does.
_PROSE_LINE = re.compile(
    r"(?im)^[ \t]*(?:\*\*|#|where[ \t]*:|(?:explanation|note|this|the|here|it|i|in this|output|"
    r"answer|assuming)(?=[ \t:,]|$))"
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def extract_sql(text: str) -> str:
    """The first SQL statement in `text`, stripped, without a trailing `;`.

    Order of preference: a fenced block tagged as SQL (or untagged) that
    contains a query; an inline `SELECT ...` code span; a SELECT/WITH that
    starts a line; an upper-case SELECT/WITH anywhere; any `select` (or a
    CTE's `with`). Never a SELECT that only continues a statement: a
    subquery or the right side of UNION / INTERSECT / EXCEPT.
    """
    text = _strip_chat_tokens(text)
    region = _fenced_region(text)
    if region is None:
        inline = _INLINE.search(text)
        region = inline.group(1) if inline else text
    start = _sql_start(region)
    if start is None:
        return region.strip().rstrip(";").strip()
    sql = region[start:]
    sql = _cut_prose(sql)
    statements = split_statements(sql)
    return statements[0] if statements else ""


def split_statements(sql: str) -> list[str]:
    """Split `sql` on semicolons outside quotes and comments; drop empty pieces.

    Quotes: '...', "...", `...`, [...]; comments: `-- ...` and `/* ... */`.
    """
    pieces, buf, i, n = [], [], 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        ch = sql[i]
        if ch in closers:
            end = sql.find(closers[ch], i + 1)
            # A doubled quote ('it''s') is an escaped quote inside the literal.
            while end != -1 and ch != "[" and sql[end + 1 : end + 2] == ch:
                end = sql.find(ch, end + 2)
            end = n - 1 if end == -1 else end
            buf.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end == -1 else end
            buf.append(sql[i:end])
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end == -1 else end + 2
            buf.append(sql[i:end])
            i = end
        elif ch == ";":
            pieces.append("".join(buf))
            buf, i = [], i + 1
        else:
            buf.append(ch)
            i += 1
    pieces.append("".join(buf))
    return [p.strip() for p in pieces if _has_code(p)]


def _has_code(piece: str) -> bool:
    """True when `piece` holds something besides whitespace and comments."""
    stripped = re.sub(r"--[^\n]*|/\*.*?(\*/|\Z)", "", piece, flags=re.DOTALL)
    return bool(stripped.strip())


def _strip_chat_tokens(text: str) -> str:
    cut = len(text)
    for marker in _END_MARKERS:
        pos = text.find(marker)
        if pos != -1:
            cut = min(cut, pos)
    return _SPECIAL_TOKEN.sub("", text[:cut])


def _fenced_region(text: str) -> str | None:
    """The content of the best code fence, or None when there is none with SQL in it."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    with_sql = [(lang, body) for lang, body in blocks if _sql_start(body) is not None]
    for lang, body in with_sql:
        if lang in _SQL_LANGS:
            return body
    return with_sql[0][1] if with_sql else None


def _sql_start(region: str) -> int | None:
    for pattern in (_START_AT_LINE, _START_UPPER, _START_ANY):
        for match in pattern.finditer(region):
            if _can_start_statement(region, match.start(1)):
                return match.start(1)
    return None


def _can_start_statement(region: str, pos: int) -> bool:
    """False for a SELECT/WITH at `pos` that is only part of a statement.

    Two such parts: a subquery, i.e. inside parentheses opened after an
    earlier query word (`select a from t where id in (SELECT id FROM u)`:
    the lower-case outer query is the answer, not the upper-case inner one),
    and the right side of UNION / INTERSECT / EXCEPT (`SELEC a FROM t UNION
    SELECT b FROM u` is a broken answer; its second half must not be scored).
    Quotes are not tracked: in the prose before a query an apostrophe
    (`Here's`) would swallow the rest of the text.
    """
    before = region[:pos]
    if _COMPOUND_BEFORE.search(before):
        return False
    depth, min_word_depth = 0, None
    words = {m.start() for m in _QUERY_WORD.finditer(before)}
    for i, ch in enumerate(before):
        if i in words:
            min_word_depth = depth if min_word_depth is None else min(min_word_depth, depth)
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
    return min_word_depth is None or depth <= min_word_depth


def _cut_prose(sql: str) -> str:
    """Drop what follows the SQL when no semicolon ends it: a blank line or a prose line."""
    first_line_end = sql.find("\n")
    if first_line_end == -1:
        return sql
    ends = [len(sql)]
    blank = _BLANK_LINE.search(sql)
    if blank:
        ends.append(blank.start())
    prose = _PROSE_LINE.search(sql, first_line_end)
    if prose:
        ends.append(prose.start())
    return sql[: min(ends)]
