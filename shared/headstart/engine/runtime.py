"""EngineRuntime: a loaded model, its forward worker, the P0 store and the sessions.

This is the engine's one entry point for every caller in a process: the CLI
replay and benchmarks, the evaluator, and (in the serving tier) each Ray
Serve replica.
"""

from __future__ import annotations

import logging
import threading
import uuid

import torch

from headstart.config import EngineSettings
from headstart.engine.errors import HeadstartError, InvalidInput
from headstart.engine.generation import GenerationRequest, SamplingParams, SubmitResult
from headstart.engine.kv import KVState, prefill
from headstart.engine.p0_store import P0Store, p0_key
from headstart.engine.policy import PaperPolicy, make_policy
from headstart.engine.session import Session, SessionLimits
from headstart.engine.session_table import SessionTable
from headstart.engine.worker import ForwardWorker, Priority  # noqa: F401 (re-exported)
from headstart.models import LoadedModel, load_model
from headstart.paths import run_dir
from headstart.prompt import PromptBuilder

log = logging.getLogger(__name__)

MODES = ("cold", "prefix")


class EngineRuntime:
    def __init__(self, settings: EngineSettings, loaded: LoadedModel | None = None):
        self.settings = settings
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.loaded = loaded or load_model(
            settings.model, settings.dtype, settings.device, settings.tokenizer_dir, settings.seed
        )
        self.worker = ForwardWorker(max_queued=settings.max_queued_jobs)
        p0_dir = (settings.p0_cache_dir or run_dir() / "p0cache") if settings.p0_cache_on_disk else None
        self.p0_store = P0Store(p0_dir)
        self.limits = SessionLimits(settings.max_text_chars, settings.max_prompt_tokens, settings.chunk_tokens)
        self.sessions = SessionTable(settings.max_sessions)
        self._prompts: dict[str, PromptBuilder] = {}
        self._lock = threading.Lock()
        self.stop_ids = self._stop_ids()

    @property
    def model(self):
        return self.loaded.model

    @classmethod
    def from_settings(cls, **kwargs) -> "EngineRuntime":
        return cls(EngineSettings(**kwargs))

    # -- databases and P0 ----------------------------------------------------

    def prompt_for(self, db: str) -> PromptBuilder:
        """The prompt builder of a database spec (Spider id, SQLite path, DSN), cached."""
        from headstart.schema.resolve import resolve_database

        with self._lock:
            if db not in self._prompts:
                resolved = resolve_database(db, spider_dir=self.settings.spider_dir)
                self._prompts[db] = PromptBuilder(self.loaded.tokenizer, resolved.schema)
            return self._prompts[db]

    def base_state(self, prompt: PromptBuilder) -> KVState:
        """P0's cache from the store, or prefilled on the worker and stored."""
        key = p0_key(self.loaded.model_id, self.loaded.dtype_name, prompt.base_ids)
        state = self.p0_store.get(key, self.loaded.device)
        if state is None:
            state = self.worker.run_sync(lambda: prefill(self.loaded.model, prompt.base_ids), Priority.STREAM, "p0")
            self.p0_store.put(key, state)
        return state

    # -- sessions ------------------------------------------------------------

    def open_session(self, db: str, policy: str = "headstart", session_id: str | None = None) -> Session:
        prompt = self.prompt_for(db)
        kwargs = {"debounce_s": self.settings.debounce_ms / 1000.0} if policy == PaperPolicy.name else {}
        confirm = make_policy(policy, **kwargs)
        base = self.base_state(prompt)
        session = Session(
            session_id or uuid.uuid4().hex, self.loaded.model, self.worker, prompt, confirm,
            base.copy(), self.stop_ids, self.limits,
        )
        self.sessions.add(session)
        return session

    # -- stateless completions -------------------------------------------------

    def start_complete(self, db: str, question: str, mode: str = "prefix",
                       params: SamplingParams = SamplingParams(), priority: Priority = Priority.POOL) -> GenerationRequest:
        """Queue a completion with no typing: `cold` prefills everything at
        submit, `prefix` starts from a warm P0 (what prefix caching gives)."""
        if mode not in MODES:
            raise InvalidInput(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        params.validate()
        prompt = self.prompt_for(db)
        ids = prompt.prompt_ids(question)
        if len(ids) + params.max_new_tokens > self.limits.max_prompt_tokens:
            from headstart.engine.errors import PromptTooLong

            raise PromptTooLong(f"prompt of {len(ids)} tokens exceeds the limit")
        base = self.base_state(prompt) if mode == "prefix" else None
        prepare = (lambda: base.copy()) if base is not None else KVState
        request = GenerationRequest(
            self.loaded.model, prompt.decode, ids, params, self.stop_ids,
            chunk_tokens=len(ids) if mode == "cold" else self.limits.chunk_tokens, prepare=prepare,
        )
        self.worker.enqueue(request.step, priority, f"{mode}:{db}")
        return request

    def complete(self, db: str, question: str, mode: str = "prefix", max_new_tokens: int = 128, **sampling) -> SubmitResult:
        return self.start_complete(db, question, mode, SamplingParams(max_new_tokens=max_new_tokens, **sampling)).result()

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

    def _stop_ids(self) -> set[int]:
        tok = self.loaded.tokenizer
        ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>") if t in tok.get_vocab()}
        eos = getattr(self.loaded.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return {i for i in ids if isinstance(i, int)}


__all__ = ["EngineRuntime", "HeadstartError"]
