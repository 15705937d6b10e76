"""`headstart tables ...`: the table cache's commands (precompute jobs, store status)."""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
from typing import Optional

import typer

tables_app = typer.Typer(no_args_is_help=True, help="Table caches: precompute blocks, inspect a store.")

MODEL_HELP = "local HF model dir, hub id, or random:<preset> (tiny, qwen2.5-coder-0.5b|1.5b|3b|7b)"


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _split(values: list[str]) -> list[str]:
    return [v for item in values for v in item.replace(",", " ").split()]


@tables_app.command("precompute")
def precompute(
    db: list[str] = typer.Option(..., help="databases: Spider ids, SQLite paths or DSNs (repeat or list them)"),
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads"),
    store: str = typer.Option("memory://", help="where blocks go: redis://host:port/db (memory:// only tests the job)"),
    table_cache: str = typer.Option("pfk", help="pfk (foreign-key groups) | independent (each table alone)"),
    force: bool = typer.Option(False, help="re-encode groups whose blocks are already stored"),
):
    """Encode every table of the databases into KV blocks and put them in the store (runs the model here)."""
    from tqdm import tqdm

    from headstart.engine.errors import HeadstartError
    from headstart.models import ModelLoadError
    from headstart.schema import SchemaError
    from headstart.tables.layout import TABLE_CACHE_MODES, LayoutError
    from headstart.tables.store import StoreError

    if table_cache not in TABLE_CACHE_MODES:
        _fail(f"unknown --table-cache {table_cache!r}; valid: {', '.join(TABLE_CACHE_MODES)}")
    runtime = None
    try:
        from headstart.config import EngineSettings
        from headstart.engine.runtime import EngineRuntime
        from headstart.tables.engine_source import TablePrefixSource
        from headstart.models import load_model
        from headstart.tables.device_tier import DeviceTier
        from headstart.tables.service import TableCacheService
        from headstart.tables.store import open_store

        # fallback=False: a precompute job must see a store failure, not turn it into a miss
        block_store = open_store(store, fallback=False)
        settings = EngineSettings(model=model, dtype=dtype, device=device, threads=threads, p0_cache_on_disk=False)
        loaded = load_model(settings.model, settings.dtype, settings.device, settings.tokenizer_dir, settings.seed, settings.weights)
        tier = DeviceTier(0, device=loaded.device)  # the job only writes blocks
        service = TableCacheService(loaded, mode=table_cache, store=block_store, tier=tier)
        runtime = EngineRuntime(settings, loaded, prefix_source=lambda rt: TablePrefixSource(rt, service))
        for name in _split(db):
            layout = service.layout(name, runtime.prompt_for(name))
            bar = tqdm(total=len(layout.groups), desc=f"{name} ({table_cache})", unit="group")
            report = runtime.prefix_source.precompute(name, skip_existing=not force,
                                                      progress=lambda _step: bar.update(1))
            bar.close()
            typer.echo(f"{name}: {report.num_tables} tables in {report.num_groups} groups; encoded "
                       f"{report.num_groups_encoded} groups ({report.num_tokens_encoded} tokens, "
                       f"{report.num_bytes_stored / 2**20:.1f} MiB), skipped {report.num_groups_skipped} already "
                       f"stored; {report.seconds:.1f} s; scope {layout.scope.prefix}")
    except (SchemaError, ModelLoadError, HeadstartError, LayoutError, StoreError, ValueError) as exc:
        _fail(str(exc))
    finally:
        if runtime is not None:
            runtime.shutdown()
