"""EngineRuntime: a loaded model, its runner, its forward worker, a prefix source and the sessions.

This is the engine's one entry point for every caller in a process: the CLI
replay and benchmarks, the evaluator, and (in the serving tier) each Ray
Serve replica. Where a prompt's head comes from (the P0 store, or table
blocks) is a `PrefixSource` (`headstart.engine.prefix_source`): the runtime
asks it and does not know which one it is. A runtime with the table cache on
is built by `headstart.build.build_runtime`, which sits above both.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import torch

from headstart.config import EngineSettings
from headstart.engine.errors import HeadstartError, InvalidInput, PromptTooLong
from headstart.engine.requests.candidates import CandidateParams, CandidateSet
from headstart.engine.requests.generation import GenerationRequest, SamplingParams, SubmitResult
from headstart.engine.kv.state import KVState
from headstart.engine.kv.memory import KVMemory
from headstart.engine.sched.forward_trace import ForwardTrace
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.kv.p0_store import P0Store
from headstart.engine.sessions.policy import PaperPolicy, make_policy
from headstart.engine.prefix_source import P0Source, PrefixHit, PrefixSource
from headstart.engine.sched.jobs import Priority
from headstart.engine.sessions.records import SessionLimits
from headstart.engine.sessions.session import Session
from headstart.engine.sessions.table import SessionTable
from headstart.engine.sched.tenant_worker import TenantWorker
from headstart.engine.sched.worker import ForwardWorker
from headstart.models import LoadedModel, load_model
from headstart.paths import run_dir
from headstart.prompt import PromptBuilder
from headstart.schema.model import Schema, SchemaError

log = logging.getLogger(__name__)

MODES = ("cold", "prefix")
# one drafted token per decode step: the most that saved decode time on Spider's answers
# (`headstart bench prompt-lookup`, docs/benchmarks.md)
DEFAULT_DRAFT_TOKENS = 1
MAX_SUBSET_PROMPTS = 256


def draft_tokens(requested: int | None) -> int:
    """Prompt-lookup drafts per decode step: as asked, else DEFAULT_DRAFT_TOKENS (measured above)."""
    return DEFAULT_DRAFT_TOKENS if requested is None else requested


class EngineRuntime:
    """Args:
        settings: the engine's settings (built at the edge).
        loaded: a model already loaded (benchmarks share one between runtimes).
        runner: `loaded`'s runner, its kernels already chosen (tests share
            one, and `auto`'s measurement, between runtimes); the runtime
            sets it to `settings`' kernel set. None: a new one.
        prefix_source: where prompt heads come from: a `PrefixSource`, or a
            function of this runtime returning one; None: the P0 store.

    Raises:
        InvalidInput: `settings` ask for the table cache and no `prefix_source`
            is given (build the runtime with `headstart.build.build_runtime`),
            or a `runner` is given without the `loaded` model it runs.
    """

    def __init__(self, settings: EngineSettings, loaded: LoadedModel | None = None,
                 prefix_source: PrefixSource | Callable[["EngineRuntime"], PrefixSource] | None = None,
                 runner: ModelRunner | None = None):
        if prefix_source is None and settings.table_cache != "off":
            raise InvalidInput(f"table_cache={settings.table_cache!r} needs the table prefix source: "
                               "build the runtime with headstart.build.build_runtime")
        if runner is not None and (loaded is None or runner.model is not loaded.model):
            raise InvalidInput("a runner is given with the model it runs (loaded)")
        self.settings = settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.worker = ForwardWorker(max_queued=settings.max_queued_jobs, max_batch_rows=settings.max_batch_rows,
                                    max_batch_tokens=settings.max_batch_tokens, batch_scope=settings.batch_scope,
                                    decode_defer_ms=settings.decode_defer_ms,
                                    stream_typing_tokens=settings.stream_typing_tokens,
                                    rerank_max_delay=settings.table_rerank_max_delay,
                                    resident_table_blocks=self._resident_table_blocks,
                                    trace=ForwardTrace(settings.trace_forwards) if settings.trace_forwards else None)
        # Set-up (loading, `auto`'s timing) runs on the worker thread, where every
        # forward runs: torch work on a second thread gives libgomp a second team,
        # more threads than cores (docs/benchmarks-archive.md, "Two OpenMP teams").
        try:
            self.loaded, self.runner = self.worker.run_sync(lambda: self._set_up(loaded, runner), name="set-up")
        except BaseException:
            self.worker.shutdown()
            raise
        self.fast_path = self.runner.fast_path  # the kernels every forward runs
        # why those kernels: with `auto`, each candidate's timings on this machine
        self.fast_path_choice = self.runner.choice
        p0_dir = (settings.p0_cache_dir or run_dir() / "p0cache") if settings.p0_cache_on_disk else None
        self.p0_store = P0Store(p0_dir)
        # drafts only where a position's logits do not depend on the forward it is in (the quantized
        # kernels): there a drafted token is kept only if one-at-a-time decoding picks it too
        self.draft_tokens = draft_tokens(settings.draft_tokens) if self.fast_path == "quant" else 0
        self.limits = SessionLimits(settings.max_text_chars, settings.max_prompt_tokens, settings.chunk_tokens,
                                    settings.answer_ahead_tokens, settings.typing_settle_ms / 1000.0,
                                    settings.typing_bulk_tokens, self.draft_tokens)
        self.kv_memory = KVMemory(settings.kv_budget_bytes, self.loaded.kv_bytes_per_token(),
                                  settings.kv_session_reserve_tokens)
        self.sessions = SessionTable(settings.max_sessions, self.kv_memory, self.p0_store.states)
        self._prompts: dict[tuple[str, tuple[str, ...] | None], PromptBuilder] = {}
        self._lock = threading.Lock()
        self.stop_ids = self._stop_ids()
        self.p0_source = P0Source(self.loaded, self.runner, self.worker, self.p0_store)
        if callable(prefix_source) and not isinstance(prefix_source, PrefixSource):
            prefix_source = prefix_source(self)
        self.prefix_source: PrefixSource = prefix_source or self.p0_source

    def _resident_table_blocks(self) -> frozenset[str]:
        """The table blocks on the device: the scheduler reranks waiting table-cache
        completions around them (before the prefix source exists: none)."""
        source = getattr(self, "prefix_source", None)
        return source.resident_table_blocks() if source is not None else frozenset()

    def _set_up(self, loaded: LoadedModel | None, runner: ModelRunner | None) -> tuple[LoadedModel, ModelRunner]:
        """The model and its runner with its kernels (on the worker thread: `__init__`)."""
        settings = self.settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        loaded = loaded or load_model(settings.model, settings.dtype, settings.device, settings.tokenizer_dir,
                                      settings.seed, settings.weights)
        # every forward's kernels
        if runner is None:
            return loaded, ModelRunner(loaded.model, fast_path=settings.fast_path,
                                       batch_invariant=settings.batch_invariant)
        runner.set_fast_path(settings.fast_path, batch_invariant=settings.batch_invariant)
        return loaded, runner

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
        from headstart.schema.resolve import resolve_database  # imports psycopg: only when needed

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

    @property
    def num_prompt_builders(self) -> int:
        """Prompt builders held (whole schemas and table orders: `prompt_for`)."""
        with self._lock:
            return len(self._prompts)

    def _db_of(self, prompt: PromptBuilder) -> str:
        with self._lock:
            for (db, _), builder in self._prompts.items():
                if builder is prompt:
                    return db
        raise InvalidInput("this prompt builder was not made by this runtime's prompt_for")

    def base_state(self, prompt: PromptBuilder) -> KVState:
        """P0 of `prompt` from the prefix source (stored P0, or assembled from
        table blocks), computed on the worker at a miss."""
        return self.prefix_source.base_state(self._db_of(prompt), prompt)

    # -- sessions ------------------------------------------------------------

    def open_session(self, db: str, policy: str = "headstart", session_id: str | None = None,
                     tenant: str | None = None, candidates: CandidateParams | None = None) -> Session:
        """A new session on `db` starting from P0 (shared). Its jobs carry
        `tenant`: the scheduler is fair across tenants within a class. Its
        candidates (None: the settings') are decoded during pauses, beside the answer-ahead."""
        prompt = self.prompt_for(db)
        kwargs = {"debounce_s": self.settings.debounce_ms / 1000.0} if policy == PaperPolicy.name else {}
        confirm = make_policy(policy, **kwargs)
        base = self.base_state(prompt)
        session = Session(
            session_id or uuid.uuid4().hex, self.runner, TenantWorker(self.worker, tenant), prompt, confirm,
            base.share(), self.stop_ids, self.limits,
            candidates=self.candidate_params(candidates, SamplingParams()),
        )
        self.sessions.add(session)
        return session

    # -- stateless completions -------------------------------------------------

    def start_complete(self, db: str, question: str, mode: str = "prefix",
                       params: SamplingParams = SamplingParams(), priority: Priority = Priority.POOL,
                       tables: Sequence[str] | None = None, tenant: str | None = None,
                       candidates: CandidateParams | None = None) -> GenerationRequest:
        """Queue a completion with no typing: `cold` prefills everything at
        submit, `prefix` starts from the prefix source's head of the prompt
        (a warm P0, what prefix caching gives, or the prompt's table blocks).
        `tables` restricts the schema to those tables in that order. The
        TTFT clock starts here, for every mode and source.

        `candidates` (None: the settings' `candidates`) with k > 1 and plain
        greedy `params`: the request is the greedy answer of a `CandidateSet`
        (its `candidates`), whose sampled candidates fork at its prefill end."""
        started = time.perf_counter()  # TTFT counts tokenization and the lookup too
        if mode not in MODES:
            raise InvalidInput(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        params.validate()
        prompt = self.prompt_for(db, tables)
        ids = prompt.prompt_ids(question)
        if len(ids) + params.max_new_tokens > self.limits.max_prompt_tokens:
            raise PromptTooLong(f"prompt of {len(ids)} tokens exceeds the limit")
        hit = self.prefix_source.lookup(db, prompt, ids) if mode == "prefix" else PrefixHit(KVState, 0)
        label = f"{mode}:{self.prefix_source.name}" if mode == "prefix" else mode
        return self.start_from_hit(prompt, ids, params, hit, priority, f"{label}:{db}", started=started,
                                   tenant=tenant, chunk_tokens=len(ids) if mode == "cold" else None,
                                   candidates=self.candidate_params(candidates, params))

    def candidate_params(self, asked: CandidateParams | None, params: SamplingParams) -> CandidateParams | None:
        """The candidates a request decodes: as asked, else the settings'; None for one
        (or for a request that is not plain greedy: its answer is not the greedy candidate)."""
        s = self.settings
        wanted = asked or CandidateParams(s.candidates, s.candidate_temperature, s.candidate_top_p,
                                           length_slack=s.candidate_length_slack)
        wanted.validate()
        return wanted if wanted.k > 1 and params.plain_greedy else None

    def start_from_hit(self, prompt: PromptBuilder, ids: list[int], params: SamplingParams, hit: PrefixHit,
                       priority: Priority, name: str, *, started: float | None = None, tenant: str | None = None,
                       chunk_tokens: int | None = None, candidates: CandidateParams | None = None) -> GenerationRequest:
        """Queue a generation request over `ids` starting from `hit`, as a job
        with an owner (so its steps batch like any request's), its tenant and
        the hit's table blocks (the scheduler's reranking hint); with
        `candidates`, the greedy answer of a candidate set."""
        release = hit.release
        cset = None if candidates is None else CandidateSet(
            candidates, self.runner, self.worker, ids, self.stop_ids, prompt.decode, params.max_new_tokens,
            name=name, tenant=tenant)
        request = GenerationRequest(
            self.runner, prompt.decode, ids, params, self.stop_ids,
            chunk_tokens=chunk_tokens or self.limits.chunk_tokens, prepare=hit.prepare, started=started,
            expected_cached=hit.cached_tokens, on_finish=(lambda _request: release()) if release else None,
            draft_tokens=self.draft_tokens, on_prefilled=cset.fork if cset is not None else None,
        )
        if cset is not None:
            cset.attach(request)
            request.candidates = cset
        try:
            request.enqueue_on(self.worker, priority, name, owner=f"request-{id(request)}", tenant=tenant,
                               table_blocks=hit.table_blocks or None)
        except BaseException:
            if release is not None:
                release()
            raise
        return request

    def complete(self, db: str, question: str, mode: str = "prefix", max_new_tokens: int = 128,
                 tables: Sequence[str] | None = None, **sampling) -> SubmitResult:
        params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
        return self.start_complete(db, question, mode, params, tables=tables,
                                   candidates=CandidateParams(1)).result()

    def close_session(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def shutdown(self) -> None:
        self.sessions.close_all()
        self.worker.shutdown()
        self.prefix_source.close()
        if self.p0_source is not self.prefix_source:
            self.p0_source.close()

    def _stop_ids(self) -> set[int]:
        tok = self.loaded.tokenizer
        ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>") if t in tok.get_vocab()}
        eos = getattr(self.loaded.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return {i for i in ids if isinstance(i, int)}


__all__ = ["EngineRuntime", "HeadstartError"]
