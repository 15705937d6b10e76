"""Cross-session batching: one forward pass over many sessions' extensions.

On a device whose forward pass is bound by reading the weights (a CPU, or a
GPU at small token counts), one pass over 8 sessions' few new tokens costs
about as much as one pass over one session's. So the worker runs a *group*
of ready jobs of one kind at once (typing prefill rows together and decode
steps together by default; `ForwardWorker.batch_scope` says which; at most
one job per owner, so no two rows share a cache) and their forward passes
meet here:

* `BatchCollector` runs each job's step on its own thread. The step code is
  unchanged: when it calls `kv.extend`, the call is parked here instead of
  running. When every step of the group has either parked a call or returned,
  the collector runs the parked calls as one padded forward (`extend_rows`),
  hands each its result and lets the steps go on. Steps that park a second
  call meet again in a next round.
* `extend_rows` pads the rows to one batch: cache i (length L_i) is copied
  left-aligned into a batch cache of length max L, the new tokens follow at
  max L, and a 4-D boolean mask lets row i see its own L_i cached keys and
  its new tokens causally, nothing else. Positions are per row (L_i + j), so
  RoPE is the same as in a lone extension. The row's new K/V are then
  appended to its own cache.

* Rows leave a forward between decoder layers. Each row's `should_abort`
  is polled before every layer; a row that asks (a newer snapshot made it
  useless, or a more urgent job arrived) is dropped from the batch there
  and its state is left as it was, and the other rows go on, smaller. So
  when a submit arrives while its own session's typing row is in a group,
  the other rows yield and that row finishes at a lone row's cost, instead
  of the submit waiting for the whole group. When every row asks, the
  forward stops.

Exactness: masked keys get weight exactly 0, positions are the same, so a
batched extension equals a lone one up to floating-point reassociation in the
matrix products (the padded shapes change the blocking). The exactness tests
run in float64, with several sessions sharing batches, where that can't flip
a token; a group of one job runs the lone path unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from headstart.engine import kv as kv_module
from headstart.engine.kv import KVState, Superseded, kept_logits

_current = threading.local()  # .collector and .rank on a step thread of a group


def active_collector() -> "BatchCollector | None":
    return getattr(_current, "collector", None)


@dataclass
class ParkedCall:
    """An `extend` call waiting for the group's next forward."""

    model: object
    state: KVState
    new_ids: list[int]
    want_logits: bool
    should_abort: Callable[[], bool] | None
    rank: tuple  # the job's scheduling rank: lower runs in an earlier forward when over budget
    done: threading.Event = field(default_factory=threading.Event)
    result: bool | None = None
    error: BaseException | None = None


class BatchCollector:
    """Runs one group of job steps with their forwards batched (see module doc).

    `run(steps)` returns, per step, `(more, error)` as a lone step would."""

    def __init__(self, pool, max_batch_tokens: int):
        self.pool = pool
        self.max_batch_tokens = max_batch_tokens
        self._cv = threading.Condition()
        self._parked: list[ParkedCall] = []
        self._running = 0
        self.forwards = 0
        self.rows = 0

    # -- step threads --------------------------------------------------------

    def extend(self, model, state: KVState, new_ids: list[int], want_logits: bool,
               should_abort: Callable[[], bool] | None) -> bool:
        """`kv.extend` on a step thread of this group: wait for the batched forward."""
        call = ParkedCall(model, state, new_ids, want_logits, should_abort, _current.rank)
        with self._cv:
            self._parked.append(call)
            self._running -= 1
            self._cv.notify_all()
        call.done.wait()  # the worker counted us as running again before waking us
        if call.error is not None:
            raise call.error
        return bool(call.result)

    def _run_step(self, step: Callable[[], bool], rank: tuple):
        _current.collector, _current.rank = self, rank
        try:
            return step(), None
        except BaseException as exc:  # reported like a lone step's failure
            return False, exc
        finally:
            _current.collector = None
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    # -- the worker thread -----------------------------------------------------

    def run(self, steps: list[tuple[Callable[[], bool], tuple]]) -> list[tuple[bool, BaseException | None]]:
        with self._cv:
            self._running = len(steps)
        futures = [self.pool.submit(self._run_step, step, rank) for step, rank in steps]
        while True:
            with self._cv:
                # every step has either parked a call or returned
                self._cv.wait_for(lambda: self._running == 0)
                if not self._parked:
                    break
                batch = self._take_batch_locked()
            self._forward(batch)
        return [f.result() for f in futures]

    def _take_batch_locked(self) -> list[ParkedCall]:
        """The parked calls of the most urgent jobs, within the token budget
        (always at least one); the rest wait for the next forward."""
        self._parked.sort(key=lambda c: c.rank)
        batch, tokens = [], 0
        for call in self._parked:
            if batch and tokens + len(call.new_ids) > self.max_batch_tokens:
                break
            batch.append(call)
            tokens += len(call.new_ids)
        del self._parked[: len(batch)]
        return batch

    def _forward(self, batch: list[ParkedCall]) -> None:
        self.forwards += 1
        self.rows += len(batch)
        try:
            if len(batch) == 1:
                call = batch[0]
                # the worker thread has no collector: this is the lone path
                results = [kv_module.extend(call.model, call.state, call.new_ids, call.want_logits,
                                            call.should_abort)]
            else:
                results = extend_rows(batch[0].model, batch)
            for call, ok in zip(batch, results):
                call.result = ok
        except BaseException as exc:
            for call in batch:
                call.error = exc
        with self._cv:  # counted before they wake, so the next rendezvous waits for them
            self._running += len(batch)
        for call in batch:
            call.done.set()


@torch.inference_mode()
def extend_rows(model, calls: list[ParkedCall]) -> list[bool]:
    """One padded forward over several states' extensions (see module doc).

    Returns one bool per call: False for a row that left the forward because
    its `should_abort` asked (its state unchanged; see the module doc).
    """
    device = next(model.parameters()).device
    lengths = [c.state.num_tokens for c in calls]
    counts = [len(c.new_ids) for c in calls]
    batch, max_len, max_new = len(calls), max(lengths), max(counts)

    input_ids = torch.zeros((batch, max_new), dtype=torch.long, device=device)
    positions = torch.zeros((batch, max_new), dtype=torch.long, device=device)
    # mask[b, 0, q, k]: row b's query q may attend to key k
    mask = torch.zeros((batch, 1, max_new, max_len + max_new), dtype=torch.bool, device=device)
    causal = torch.tril(torch.ones((max_new, max_new), dtype=torch.bool, device=device))
    for b, (call, length, count) in enumerate(zip(calls, lengths, counts)):
        input_ids[b, :count] = torch.tensor(call.new_ids, dtype=torch.long, device=device)
        input_ids[b, count:] = call.new_ids[-1]  # padding queries: any token, never seen by real rows
        positions[b] = torch.arange(length, length + max_new, device=device)
        mask[b, 0, :, :length] = True
        mask[b, 0, :, max_len:] = causal
        mask[b, 0, :, max_len + count:] = False  # padding queries still see this row's real new keys

    cache = DynamicCache()
    if max_len:
        layers = _layers(calls)
        for i in range(len(layers)):
            ref = layers[i]
            keys = ref.keys.new_zeros((batch, ref.keys.shape[1], max_len, ref.keys.shape[3]))
            values = ref.values.new_zeros((batch, ref.values.shape[1], max_len, ref.values.shape[3]))
            for b, (call, length) in enumerate(zip(calls, lengths)):
                if length:
                    keys[b, :, :length] = call.state.cache.layers[i].keys[0]
                    values[b, :, :length] = call.state.cache.layers[i].values[0]
            cache.update(keys, values, i)

    hooks = kv_module.layer_hooks(model)
    plan = _RowPlan(cache, [c.should_abort for c in calls], len(model.model.layers))
    hooks.before_layer = plan.before_layer
    try:
        # the decoder stack only: the LM head runs below on each row's own last
        # position, not on every row at every position some row needs (a
        # group of 8 typing rows of 8 lengths would run it on 64 positions)
        hidden = model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True).last_hidden_state
    except Superseded:
        return [False] * batch
    finally:
        hooks.before_layer = None

    wanted = [(final, b) for final, b in enumerate(plan.rows) if calls[b].want_logits]
    logits = {}
    if wanted:
        which = torch.tensor([final for final, _ in wanted], device=device)
        last = torch.tensor([counts[b] - 1 for _, b in wanted], device=device)
        rows = model.lm_head(hidden[which, last])  # (rows wanting logits, vocab)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:  # as the causal-LM classes that have it apply it (Gemma 2)
            rows = torch.tanh(rows / cap) * cap
        logits = {b: rows[i] for i, (_, b) in enumerate(wanted)}

    kept = set(plan.rows)
    for final, b in enumerate(plan.rows):
        call, count = calls[b], counts[b]
        state = call.state
        if state.cache is None:
            state.cache = DynamicCache()
        for i, layer in enumerate(cache.layers):
            at = plan.layer_rows[i].index(b)  # rows that left earlier are missing from later layers
            state.cache.update(layer.keys[at:at + 1, :, max_len:max_len + count].contiguous(),
                               layer.values[at:at + 1, :, max_len:max_len + count].contiguous(), i)
        state.ids.extend(call.new_ids)
        state.last_logits = kept_logits(logits[b]) if call.want_logits else None
    return [b in kept for b in range(batch)]


class _RowPlan:
    """Which rows of one batched forward are still in it, layer by layer."""

    def __init__(self, cache: DynamicCache, checks: list, num_layers: int):
        self.cache = cache
        self.checks = checks
        self.batch = len(checks)
        self.rows = list(range(self.batch))  # original indices still running
        self.layer_rows = [self.rows] * num_layers  # rows present in each layer's cache

    def before_layer(self, index: int, args: tuple, kwargs: dict):
        leaving = [b for b in self.rows if self.checks[b] is not None and self.checks[b]()]
        if len(leaving) == len(self.rows):
            raise Superseded()
        if leaving:
            local = torch.tensor([at for at, b in enumerate(self.rows) if b not in leaving],
                                 device=args[0].device)
            self.rows = [b for b in self.rows if b not in leaving]
            for i in range(index, len(self.layer_rows)):
                layer = self.cache.layers[i]
                layer.keys, layer.values = layer.keys.index_select(0, local), layer.values.index_select(0, local)
                self.layer_rows[i] = self.rows
            args = (args[0].index_select(0, local),) + tuple(args[1:])
        if len(self.rows) == self.batch:
            return None
        # the model passes every layer the full batch's mask, positions and
        # rotary embeddings: cut them to the rows still running
        rows = torch.tensor(self.rows, device=args[0].device)
        kwargs = dict(kwargs)
        for name in ("attention_mask", "position_ids"):
            if isinstance(kwargs.get(name), torch.Tensor):
                kwargs[name] = kwargs[name].index_select(0, rows)
        if kwargs.get("position_embeddings") is not None:
            kwargs["position_embeddings"] = tuple(t.index_select(0, rows) for t in kwargs["position_embeddings"])
        return args, kwargs


def _layers(calls: list[ParkedCall]):
    for call in calls:
        if call.state.cache is not None and call.state.num_tokens:
            return call.state.cache.layers
    raise AssertionError("a batch with cached tokens has no cache")
