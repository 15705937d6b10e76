"""Recognise PostgreSQL DSNs and redact their passwords for messages and logs."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit


REDACTED = "***"
POSTGRES_URI_SCHEMES = ("postgresql://", "postgres://")

# key=value conninfo: password=secret or password='se cret' (backslash escapes).
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:\\.|[^'\\])*'|\S*)", re.IGNORECASE)


def is_postgres_dsn(spec: str) -> bool:
    """True for a `postgresql://` or `postgres://` URI (the forms headstart accepts)."""
    return spec.strip().lower().startswith(POSTGRES_URI_SCHEMES)


def redact_dsn(dsn: str) -> str:
    """`dsn` with every password replaced by `***`, safe to log or show.

    Handles the password in a URI's user info (`user:secret@host`), in a URI
    query (`?password=secret`) and in key=value conninfo (`password=secret`).
    """
    if not is_postgres_dsn(dsn):
        return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + REDACTED, dsn)
    parts = urlsplit(dsn.strip())
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{REDACTED}@{hosts}"
    query = "&".join(_redact_query_item(item) for item in parts.query.split("&"))
    query = query if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_query_item(item: str) -> str:
    key = item.split("=", 1)[0]
    return f"{key}={REDACTED}" if unquote(key).strip().lower() == "password" else item


def scrub_password(text: str, dsn: str) -> str:
    """`text` (an error message, say) with any password written in `dsn` replaced by `***`.

    Password-shaped places are always masked (the DSN itself, `password=...`
    pairs, `scheme://user:password@`). A bare occurrence is masked only when
    it stands alone (no letter or digit on either side) and the password has
    at least MIN_BARE_PASSWORD_CHARS characters: a plain text replace would
    turn a one-letter password into a mask of every such letter, telling the
    password by where the masks fall.
    """
    import psycopg  # here, not at import: a replica serving only SQLite never loads it (9 MiB)
    from psycopg.conninfo import conninfo_to_dict

    secrets = set()
    try:
        secrets.add(conninfo_to_dict(dsn).get("password") or "")
    except psycopg.Error:  # libpq cannot parse it: only the URI user info is left to scrub
        pass
    if is_postgres_dsn(dsn):
        userinfo = urlsplit(dsn.strip()).netloc.rpartition("@")[0]
        raw = userinfo.partition(":")[2]
        secrets.update({raw, unquote(raw)})
    stripped = dsn.strip()
    if stripped and stripped in text:
        text = text.replace(stripped, redact_dsn(stripped))
    text = _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + REDACTED, text)
    text = _USERINFO_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    for secret in sorted((s for s in secrets if len(s) >= MIN_BARE_PASSWORD_CHARS), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", REDACTED, text)
    return text


MIN_BARE_PASSWORD_CHARS = 4
# scheme://user:password@ anywhere in a message (an echoed URI).
_USERINFO_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?!\*\*\*@)[^@\s]*@", re.IGNORECASE)
