"""EngineRuntime: a loaded model, its forward worker, the P0 store and the sessions.

This is the engine's one entry point for every caller in a process: the CLI
replay and benchmarks, the evaluator, and (in the serving tier) each Ray
Serve replica.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import torch

from headstart.config import EngineSettings
from headstart.engine.errors import HeadstartError, InvalidInput
from headstart.engine.generation import GenerationRequest, SamplingParams, SubmitResult
from headstart.engine.kv import KVState, prefill
from headstart.engine.kv_memory import KVMemory
from headstart.engine.model_runner import enable_fast_path
from headstart.engine.p0_store import P0Store, p0_key
from headstart.engine.policy import PaperPolicy, make_policy
from headstart.engine.session import Session, SessionLimits
from headstart.engine.session_table import SessionTable
from headstart.engine.worker import ForwardWorker, Priority  # noqa: F401 (re-exported)
from headstart.models import LoadedModel, load_model
from headstart.paths import run_dir
from headstart.prompt import PromptBuilder
from headstart.schema.model import Schema, SchemaError

log = logging.getLogger(__name__)

MODES = ("cold", "prefix")
MAX_SUBSET_PROMPTS = 256


class EngineRuntime:
    """Args:
        settings: the engine's settings (built at the edge).
        loaded: a model already loaded (benchmarks share one between runtimes).
        table_cache: a table cache service to use instead of the one `settings` describe.
    """

    def __init__(self, settings: EngineSettings, loaded: LoadedModel | None = None, table_cache=None):
        self.settings = settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.loaded = loaded or load_model(
            settings.model, settings.dtype, settings.device, settings.tokenizer_dir, settings.seed
        )
        self.fast_path = enable_fast_path(self.loaded.model, settings.fast_path,  # every forward's kernels
                                          batch_invariant=settings.batch_invariant)
        self.worker = ForwardWorker(max_queued=settings.max_queued_jobs, max_batch_rows=settings.max_batch_rows,
                                    max_batch_tokens=settings.max_batch_tokens, batch_scope=settings.batch_scope,
                                    decode_defer_ms=settings.decode_defer_ms)
        p0_dir = (settings.p0_cache_dir or run_dir() / "p0cache") if settings.p0_cache_on_disk else None
        self.p0_store = P0Store(p0_dir)
        self.limits = SessionLimits(settings.max_text_chars, settings.max_prompt_tokens, settings.chunk_tokens,
                                    settings.answer_ahead_tokens)
        self.kv_memory = KVMemory(settings.kv_budget_bytes, self.loaded.kv_bytes_per_token(),
                                  settings.kv_session_reserve_tokens)
        self.sessions = SessionTable(settings.max_sessions, self.kv_memory, self.p0_store.states)
        self._prompts: dict[tuple[str, tuple[str, ...] | None], PromptBuilder] = {}
        self._lock = threading.Lock()
        self.stop_ids = self._stop_ids()
        self.table_cache = table_cache
        if table_cache is None and settings.table_cache != "off":
            from headstart.tables.service import TableCacheService

            self.table_cache = TableCacheService.from_settings(settings, self.loaded)

    @property
    def model(self):
        return self.loaded.model

    @classmethod
    def from_settings(cls, **kwargs) -> "EngineRuntime":
        return cls(EngineSettings(**kwargs))

    # -- databases and P0 ----------------------------------------------------

    def prompt_for(self, db: str, tables: Sequence[str] | None = None) -> PromptBuilder:
        """The prompt builder of a database spec (Spider id, SQLite path, DSN), cached.

        `tables` restricts the schema to those tables, in that order (schema
        linking); each order gets its own builder.

        Raises:
            InvalidInput: `tables` is empty, repeats a table or names one the database lacks.
        """
        from headstart.schema.resolve import resolve_database

        key = (db, None if tables is None else tuple(tables))
        with self._lock:
            if key in self._prompts:
                return self._prompts[key]
        if tables is None:
            resolved = resolve_database(db, spider_dir=self.settings.spider_dir)
            return self._remember_prompt(key, resolved.schema)
        if not tables or len({t.lower() for t in tables}) != len(tables):
            raise InvalidInput(f"tables must name distinct tables of {db!r}, got {list(tables)}")
        try:
            schema = self.prompt_for(db).schema.subset(list(tables))
        except SchemaError as exc:
            raise InvalidInput(str(exc)) from exc
        return self._remember_prompt(key, schema)

    def register_schema(self, db: str, schema: Schema) -> PromptBuilder:
        """Serve `schema` under the name `db` (schemas from a file no spec resolves, e.g. BIRD)."""
        return self._remember_prompt((db, None), schema)

    def _remember_prompt(self, key: tuple[str, tuple[str, ...] | None], schema: Schema) -> PromptBuilder:
        with self._lock:
            if key not in self._prompts:
                self._prompts[key] = PromptBuilder(self.loaded.tokenizer, schema)
                self._forget_old_subsets_locked()
            return self._prompts[key]

    def _forget_old_subsets_locked(self) -> None:
        """Clients choose table orders: keep at most MAX_SUBSET_PROMPTS of them
        (oldest first out); whole-schema builders stay."""
        subsets = [k for k in self._prompts if k[1] is not None]
        for key in subsets[: max(0, len(subsets) - MAX_SUBSET_PROMPTS)]:
            del self._prompts[key]

    def _db_of(self, prompt: PromptBuilder) -> str:
        with self._lock:
            for (db, _), builder in self._prompts.items():
                if builder is prompt:
                    return db
        raise InvalidInput("this prompt builder was not made by this runtime's prompt_for")

    def base_state(self, prompt: PromptBuilder) -> KVState:
        """P0's cache from the store, else prefilled (or, with the table cache on,
        assembled from table blocks) on the worker and stored."""
        if self.table_cache is not None:
            from headstart.tables.requests import table_base_state

            return table_base_state(self, self._db_of(prompt), prompt)
        key = p0_key(self.loaded.model_id, self.loaded.dtype_name, prompt.base_ids)
        state = self.p0_store.get(key, self.loaded.device)
        if state is None:
            state = self.worker.run_sync(lambda: prefill(self.loaded.model, prompt.base_ids), Priority.STREAM, "p0")
            self.p0_store.put(key, state)
        return state

    # -- table cache -----------------------------------------------------------

    def table_layout(self, db: str):
        """The table layout of `db`; the first call precomputes missing blocks when configured."""
        from headstart.tables.requests import require_table_cache

        layout = require_table_cache(self).layout(db, self.prompt_for(db))
        first = self.table_cache.claim_first_use(db)
        if first and self.settings.table_precompute_on_open and self.table_cache.missing_tables(layout):
            self.precompute_tables(db)
        if first:
            self.worker.run_sync(lambda: self.table_cache.warm(layout), Priority.STREAM, "tables:head")
        return layout

    def precompute_tables(self, db: str, *, skip_existing: bool = True,
                          progress: Callable[[object], None] | None = None):
        """Encode and store `db`'s table blocks on the worker, one group per step.

        Returns a `PrecomputeReport`; `progress` is called with each `GroupProgress`.
        """
        from headstart.tables.requests import precompute_on_worker

        return precompute_on_worker(self, db, skip_existing=skip_existing, progress=progress)

    def complete_batch(self, items, params: SamplingParams = SamplingParams(), **options):
        """Serve a batch of table-cache completions, reranked and pipelined
        (`headstart.tables.batch.serve_batch`, whose options this takes)."""
        from headstart.tables.batch import serve_batch

        return serve_batch(self, items, params, **options)

    # -- sessions ------------------------------------------------------------

    def open_session(self, db: str, policy: str = "headstart", session_id: str | None = None) -> Session:
        prompt = self.prompt_for(db)
        kwargs = {"debounce_s": self.settings.debounce_ms / 1000.0} if policy == PaperPolicy.name else {}
        confirm = make_policy(policy, **kwargs)
        base = self.base_state(prompt)
        session = Session(
            session_id or uuid.uuid4().hex, self.loaded.model, self.worker, prompt, confirm,
            base.share(), self.stop_ids, self.limits,
        )
        self.sessions.add(session)
        return session

    # -- stateless completions -------------------------------------------------

    def start_complete(self, db: str, question: str, mode: str = "prefix",
                       params: SamplingParams = SamplingParams(), priority: Priority = Priority.POOL,
                       tables: Sequence[str] | None = None) -> GenerationRequest:
        """Queue a completion with no typing: `cold` prefills everything at
        submit, `prefix` starts from a warm P0 (what prefix caching gives) or,
        with the table cache on, from the prompt's table blocks. `tables`
        restricts the schema to those tables in that order."""
        started = time.perf_counter()  # TTFT counts tokenization too
        if mode not in MODES:
            raise InvalidInput(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        params.validate()
        prompt = self.prompt_for(db, tables)
        ids = prompt.prompt_ids(question)
        if len(ids) + params.max_new_tokens > self.limits.max_prompt_tokens:
            from headstart.engine.errors import PromptTooLong

            raise PromptTooLong(f"prompt of {len(ids)} tokens exceeds the limit")
        if mode == "prefix" and self.table_cache is not None:
            from headstart.tables.requests import table_request

            request = table_request(self, db, prompt, ids, params)
            request.enqueue_on(self.worker, priority, f"tables:{db}")
            return request
        base = self.base_state(prompt) if mode == "prefix" else None
        prepare = (lambda: base.share()) if base is not None else KVState
        request = GenerationRequest(
            self.loaded.model, prompt.decode, ids, params, self.stop_ids,
            chunk_tokens=len(ids) if mode == "cold" else self.limits.chunk_tokens, prepare=prepare,
            started=started, expected_cached=base.num_tokens if base is not None else 0,
        )
        request.enqueue_on(self.worker, priority, f"{mode}:{db}", owner=f"request-{id(request)}")
        return request

    def complete(self, db: str, question: str, mode: str = "prefix", max_new_tokens: int = 128,
                 tables: Sequence[str] | None = None, **sampling) -> SubmitResult:
        params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
        return self.start_complete(db, question, mode, params, tables=tables).result()

    def replay_typed(self, db: str, question: str, policy: str = "headstart", wpm: float = 40.0,
                     typo_rate: float = 0.0, pause_s: float = 0.0, seed: int = 0, speed: float = 1.0,
                     max_new_tokens: int = 128) -> SubmitResult:
        """Type `question` as a synthetic typist into a fresh session, then submit."""
        from headstart.replay import replay_trace
        from headstart.typist import Typist

        trace = Typist(wpm=wpm, typo_rate=typo_rate, pause_s=pause_s, seed=seed).trace(question)
        session = self.open_session(db, policy)
        try:
            return replay_trace(session, trace, SamplingParams(max_new_tokens=max_new_tokens), speed=speed)
        finally:
            self.close_session(session.session_id)

    def close_session(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def shutdown(self) -> None:
        self.sessions.close_all()
        self.worker.shutdown()
        if self.table_cache is not None:
            self.table_cache.close()

    def _stop_ids(self) -> set[int]:
        tok = self.loaded.tokenizer
        ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>") if t in tok.get_vocab()}
        eos = getattr(self.loaded.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return {i for i in ids if isinstance(i, int)}


__all__ = ["EngineRuntime", "HeadstartError"]
