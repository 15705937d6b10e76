"""Build an `EngineRuntime` from settings, with the prefix source they ask for.

The engine knows only the `PrefixSource` interface; the table cache
implements it on top of the engine. This module sits above both and is what
the edges (the CLI, each Serve replica, the evaluator) call:
`build_runtime(settings)` gives a runtime whose prompt heads come from the P0
store (`table_cache="off"`) or from table blocks (`pfk`, `independent`).
"""

from __future__ import annotations

from headstart.config import EngineSettings
from headstart.engine.runtime import EngineRuntime
from headstart.models import LoadedModel
from headstart.tables.engine_source import TablePrefixSource
from headstart.tables.service import TableCacheService


def build_runtime(settings: EngineSettings | None = None, loaded: LoadedModel | None = None,
                  service: TableCacheService | None = None, **overrides) -> EngineRuntime:
    """A runtime for `settings` (or `EngineSettings(**overrides)`).

    Args:
        loaded: a model already loaded (benchmarks share one between runtimes).
        service: a table cache to use instead of the one `settings` describe
            (it turns the table source on whatever `settings.table_cache` says).
    """
    if settings is None:
        settings = EngineSettings(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    if service is None and settings.table_cache == "off":
        return EngineRuntime(settings, loaded)

    def table_prefix_source(runtime: EngineRuntime) -> TablePrefixSource:
        return TablePrefixSource(runtime, service or TableCacheService.from_settings(settings, runtime.loaded))

    return EngineRuntime(settings, loaded, prefix_source=table_prefix_source)
