"""A session's candidates decoded during a pause: the sampled answers beside the greedy answer-ahead.

When the session's greedy answer decoded ahead has ended (its stop token
or the answer-ahead budget: `Session.after_ahead_step`), `AheadCandidates.start`
forks the K-1 sampled candidates of a `CandidateSet` from the session's
cache (`requests.candidates`; cropped back to the prompt, each one's first
step computes the prompt's logits again), at IDLE like the greedy
answer-ahead, riding in others' forwards only once the text reads as a
finished question (`policy.looks_complete`, the rule `AheadWork` follows).
They start after the greedy answer, not beside it, so the greedy answer is
as far along at Enter as without candidates, and its length bounds theirs
from their first token (`CandidateSet.bound`). A text change
cancels them (`cancel`). At submit, `for_submit` hands them over when the
submit asks the same candidates of the same prompt, up to a cap no longer
than the pause's (the answer-ahead's): each is cut at the submit's cap, the
ones not finished go on to it; else it cancels them and returns a new set
that forks from the submit's cache once its prefill ends (or at once, past
the answer decoded ahead). Being seeded per index and drawing once per
token, candidates forked during a pause are those a cold request would
decode, and their first n tokens those a cold request capped at n would.
"""

from __future__ import annotations

import threading

from headstart.engine.requests.candidates import CandidateParams, CandidateSet
from headstart.engine.requests.sampling import SamplingParams
from headstart.engine.sessions.policy import looks_complete


class AheadCandidates:
    """The candidate set of a session's pause, if any (`session` is its `Session`)."""

    def __init__(self, session, params: CandidateParams | None, max_new_tokens: int):
        if params is not None:
            params.validate()
        self.session, self.max_new_tokens = session, max_new_tokens
        self.params = params if params is not None and params.k > 1 else None
        self._lock = threading.Lock()
        self._set: CandidateSet | None = None
        self._prompt: list[int] = []

    def _new_set(self, params: CandidateParams, prompt_ids: list[int], max_new_tokens: int,
                 pause: bool = True) -> CandidateSet:
        """A set of this session's: a pause's rides as its answer-ahead does (once the text
        reads as a finished question); a submit's always (`CandidateSet._may_ride`)."""
        s = self.session
        return CandidateSet(params, s.runner, s.worker, prompt_ids, s.stop_ids, s.prompt.decode, max_new_tokens,
                            name=f"candidates:{s.session_id}", rides=(lambda: looks_complete(s.text)) if pause else None)

    def after_greedy(self, kv, prompt_ids: list[int], ahead) -> None:
        """The greedy answer decoded ahead (`ahead`, the session's `AnswerAhead`) has ended
        (its stop token, or the answer-ahead budget): the pause's candidates start now
        (worker thread, the session's lock held). After it, not beside it: riding in its
        forwards they made each of its steps up to 3.75x slower on a 2-core CPU, so it was
        no longer complete at Enter; and once it has stopped, its length bounds theirs."""
        tokens = ahead.usable_for(list(kv.ids), prompt_ids)
        if tokens:
            self.start(kv, prompt_ids, len(tokens) - 1 if tokens[-1] in ahead.stop_ids else None)

    def start(self, kv, prompt_ids: list[int], greedy_stopped: int | None = None) -> None:
        """Fork the pause's candidates from `kv` (the prompt, then the greedy answer decoded
        ahead, which `greedy_stopped` says stopped after that many tokens; None: it did not
        stop within the answer-ahead budget). Worker thread."""
        if self.params is None:
            return
        with self._lock:
            if self._set is not None and self._prompt == list(prompt_ids):
                return  # the same question caught up again: its candidates run on
        cset = self._new_set(self.params, list(prompt_ids), self.max_new_tokens)
        if greedy_stopped is not None:
            cset.greedy_stopped(greedy_stopped)
        cset.greedy_ended()  # the answer decoded ahead has: its candidates are queued as they fork
        self.cancel()
        cset.fork(kv)
        with self._lock:
            self._set, self._prompt = cset, list(prompt_ids)

    def states(self) -> list:
        """The pause's candidates' caches still held (accounting: read-only)."""
        cset = self._set
        return cset.states() if cset is not None else []

    def cancel(self) -> None:
        """The text changed (or the session closed): the pause's candidates end."""
        with self._lock:
            cset, self._set = self._set, None
        if cset is not None:
            cset.cancel()

    def for_submit(self, prompt_ids: list[int], params: SamplingParams,
                   asked: CandidateParams | None) -> CandidateSet | None:
        """The candidate set of a submit of `prompt_ids` (None: the greedy answer
        alone): the pause's, handed over, or a new one to fork at the submit's prefill."""
        wanted = asked if asked is not None else self.params
        if wanted is not None:
            wanted.validate()
        if wanted is None or wanted.k < 2 or not params.plain_greedy:
            self.cancel()
            return None
        with self._lock:
            cset = self._set
            same = (cset is not None and self._prompt == prompt_ids and cset.params == wanted
                    and cset.max_new_tokens >= params.max_new_tokens)
            if same:
                self._set = None
        if same:  # cut at the submit's cap, as the greedy answer's tokens decoded ahead are
            cset.hand_over(params.max_new_tokens)
            return cset
        self.cancel()
        return self._new_set(wanted, prompt_ids, params.max_new_tokens, pause=False)

    def fork_late(self, cset: CandidateSet | None) -> None:
        """A submit whose whole answer was known at once ran no step: fork its new
        candidates from the session's cache in a job of their own (worker thread)."""
        if cset is not None and not cset.forked:
            cset.fork_in_job(lambda: self.session.kv_state)
