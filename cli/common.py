"""What the command files share: option help texts, the error exit, list options, the engine from options."""

from __future__ import annotations

import typer

MODEL_HELP = ("a catalogue model (`headstart model list`: qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct), "
              "a .gguf file, a local HF model dir, a hub id, or random:<preset> (tiny, qwen2.5-coder-0.5b|1.5b|3b|7b: "
              "real shapes, random weights, for tests)")
TABLE_CACHE_MODES = ("off", "pfk", "independent")
TABLE_CACHE_HELP = "table blocks for P0 and completions: off | pfk (foreign-key groups) | independent"
FAST_PATH_CASES = ("off", "onednn", "native", "inductor", "auto")
TABLE_STORE_HELP = "table block store: memory:// or redis://host:port/db"
# Options that take several values after one flag (`--db world_1 car_1`): `app.main` folds them.
LIST_OPTIONS = frozenset({"--db", "--dbs"})


def fail(message: str, code: int = 2) -> None:
    """Print `error: message` in red on stderr and exit with `code` (2: a bad option value)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def check_table_cache(table_cache: str) -> None:
    """Exit 2 naming the valid modes when `--table-cache` is not one of them."""
    if table_cache not in TABLE_CACHE_MODES:
        fail(f"unknown --table-cache {table_cache!r}; valid: {', '.join(TABLE_CACHE_MODES)}")


def split_values(values: list[str]) -> list[str]:
    """Accept `--db a b` and `--db a,b` style lists as well as repeated options."""
    return [v for item in values for v in item.replace(",", " ").split()]


def fold_list_options(argv: list[str]) -> list[str]:
    """`--db world_1 car_1` -> `--db world_1 --db car_1`: typer takes one value per option, so the
    extra positional values after a list option are folded into repeats of it before parsing."""
    folded: list[str] = []
    current = None
    for arg in argv:
        if arg.startswith("-"):
            current = arg if arg in LIST_OPTIONS else None
            folded.append(arg)
        elif current and folded and folded[-1] != current and not folded[-1].startswith("-"):
            folded.extend([current, arg])
        else:
            folded.append(arg)
    return folded


def runtime_from_options(**settings):
    """An EngineRuntime from CLI options; a bad option value exits with code 2 and a clear message."""
    from pydantic import ValidationError

    from headstart.build import build_runtime
    from headstart.config import EngineSettings

    try:
        parsed = EngineSettings(**settings)
    except ValidationError as exc:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    return build_runtime(parsed)
