"""The tenant reaches the engine's jobs (gateway metadata -> replica -> runtime ->
scheduler), and the prefix-source interface: table-cache completions are jobs
with an owner, a tenant and their blocks, and their TTFT clock starts at submit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest

from headstart.build import build_runtime
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.prefix_source import P0Source, PrefixSource
from headstart.engine.runtime import EngineRuntime
from headstart.engine.sched.jobs import Priority
from headstart.tables.engine_source import TablePrefixSource
from headstart.v1 import engine_pb2
from services.engine import events
from services.engine.core import ReplicaCore
from services.engine.guard import TENANT_METADATA_KEY, tenant_of
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings

DB = "concert_singer"
TINY = dict(model="random:tiny", dtype="float64", p0_cache_on_disk=False)


def record_jobs(runtime: EngineRuntime) -> list:
    """Every job the runtime's scheduler is given (first queueing only), as it is added."""
    seen: list = []
    scheduler = runtime.worker.scheduler
    add = scheduler.add

    def spy(job, now):
        if all(job is not other for other in seen):
            seen.append(job)
        add(job, now)

    scheduler.add = spy
    return seen


@pytest.fixture(scope="module")
def runtime():
    rt = build_runtime(**TINY)
    yield rt
    rt.shutdown()


def test_sessions_and_completions_carry_their_tenant(runtime):
    jobs = record_jobs(runtime)
    session = runtime.open_session(DB, tenant="A")
    try:
        session.update(1, "How many singers")
        session.wait_idle(60)  # the typing job is queued before the submit can supersede it
        session.submit(2, "How many singers are there?", SamplingParams(max_new_tokens=3)).result(timeout=120)
    finally:
        runtime.close_session(session.session_id)
    runtime.start_complete(DB, "How many concerts?", params=SamplingParams(max_new_tokens=2),
                           tenant="B").result(timeout=120)
    tenants = {job.name.split(":")[0]: job.tenant for job in jobs}
    assert tenants["type"] == "A" and tenants["submit"] == "A"
    assert tenants["prefix"] == "B"
    assert all(job.owner for job in jobs if job.name.startswith(("type", "submit", "prefix")))


def test_the_replica_core_passes_the_tenant_to_the_session(runtime):
    core = ReplicaCore(runtime.settings, max_attached=2, runtime=runtime)
    jobs = record_jobs(runtime)
    result = core.attach("sid-tenant", DB, "headstart", "tenant-x")
    try:
        result.session.update(1, "How many")
        deadline = time.monotonic() + 60
        while not any(job.name.startswith("type:") for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        core.detach("sid-tenant")
        core.close("sid-tenant")
    assert {job.tenant for job in jobs if job.name.startswith("type:")} == {"tenant-x"}


def test_tenant_metadata():
    assert tenant_of([("application", "x"), (TENANT_METADATA_KEY, "acme")]) == "acme"
    assert tenant_of([("application", "x")]) is None
    assert tenant_of(None) is None


class _Call:
    """A fake `Engine.Session` call: answers attach, then waits."""

    def __init__(self):
        self.sent = []

    async def write(self, request):
        self.sent.append(request)

    async def read(self):
        if len(self.sent) == 1:
            self.sent.append("read")
            return events.attached("replica-x", True)
        await asyncio.sleep(3600)

    def cancel(self):
        pass


class _Stream:
    """A fake `Engine.Complete` call: one error event."""

    def __aiter__(self):
        return self._events()

    async def _events(self):
        yield events.error("INTERNAL", "not a real engine")

    def cancel(self):
        pass


class _Stub:
    """Records the metadata of every engine call."""

    def __init__(self):
        self.metadata = {}

    def Session(self, metadata):  # noqa: N802
        self.metadata["Session"] = metadata
        return _Call()

    def Complete(self, request, metadata):  # noqa: N802
        self.metadata["Complete"] = metadata
        return _Stream()

    async def CloseSession(self, ref, metadata, timeout):  # noqa: N802
        return None

    async def Locate(self, ref, metadata, timeout):  # noqa: N802 (no direct address: the stream takes Session above)
        self.metadata["Locate"] = metadata
        return engine_pb2.EngineLocation(replica="r")


def test_the_gateway_names_the_tenant_on_every_engine_call(tmp_path):
    sqlite3.connect(tmp_path / "shop.sqlite").execute("CREATE TABLE t (a INT)").connection.close()
    service = GatewayService(GatewaySettings(spider_dir=tmp_path, sqlite_roots=[tmp_path]))
    stub = service._stub = _Stub()

    async def scenario():
        session = await service.open("acme", "shop", ephemeral=False)
        await service.close("acme", session.session_id)
        async for _ in service.complete("globex", "shop", "how many?"):
            pass
        service._runs.shutdown()

    asyncio.run(scenario())
    assert (TENANT_METADATA_KEY, "acme") in stub.metadata["Session"]
    assert (TENANT_METADATA_KEY, "acme") in stub.metadata["Locate"]
    assert (TENANT_METADATA_KEY, "globex") in stub.metadata["Complete"]


# -- prefix sources ------------------------------------------------------------------------


def test_the_runtime_asks_one_interface(runtime):
    assert isinstance(runtime.prefix_source, P0Source) and isinstance(runtime.prefix_source, PrefixSource)
    hit = runtime.prefix_source.lookup(DB, runtime.prompt_for(DB), runtime.prompt_for(DB).prompt_ids("q"))
    assert hit.cached_tokens == len(runtime.prompt_for(DB).base_ids) and hit.table_blocks == frozenset()


@pytest.fixture(scope="module")
def tables_runtime():
    rt = build_runtime(**TINY, table_cache="pfk", table_store_url="memory://", batch_scope="all",
                       max_batch_rows=4, max_batch_tokens=4096)
    assert isinstance(rt.prefix_source, TablePrefixSource) and isinstance(rt.prefix_source, PrefixSource)
    rt.prefix_source.layout(DB)  # precompute and warm before the tests' clocks
    yield rt
    rt.shutdown()


def test_a_table_completion_starts_its_clock_at_submit(tables_runtime):
    """The TTFT clock starts before the lookup, as the prefix path's does
    (compared as instants, not as a duration)."""
    source = tables_runtime.prefix_source
    looked_up = []
    lookup = source.lookup
    source.lookup = lambda *args: looked_up.append(time.perf_counter()) or lookup(*args)
    try:
        request = tables_runtime.start_complete(DB, "How many singers?", params=SamplingParams(max_new_tokens=2),
                                                tables=["singer", "concert"], tenant="A")
        request.result(timeout=120)
    finally:
        del source.lookup
    assert request.started <= looked_up[0] <= request.first_token_at
    assert request.job.owner and request.job.tenant == "A"
    assert request.job.table_blocks and all(key.endswith((":singer", ":concert")) for key in request.job.table_blocks)


def test_table_completions_share_a_batched_forward(tables_runtime):
    """Owned jobs batch (scope "all"): completions queued together meet in one
    group, and each still gives its lone answer (float64)."""
    worker = tables_runtime.worker
    params = SamplingParams(max_new_tokens=3)
    questions = [("How many singers?", ["singer"]), ("Names of stadiums?", ["stadium", "concert"]),
                 ("Concerts per year?", ["concert"])]
    lone = [tables_runtime.start_complete(DB, q, params=params, tables=t).result(timeout=120).token_ids
            for q, t in questions]
    before = worker.batched_groups
    gate = worker.enqueue(lambda: time.sleep(0.3) or False, Priority.FLASH, "hold")  # let all three queue
    requests = [tables_runtime.start_complete(DB, q, params=params, tables=t) for q, t in questions]
    gate.wait(30)
    assert [r.result(timeout=120).token_ids for r in requests] == lone
    assert worker.batched_groups > before


def test_the_worker_does_no_store_io_for_a_completion(tables_runtime):
    """Blocks the device tier lacks are read from the store at lookup, on the
    caller's thread; the worker only admits them to the device."""
    service = tables_runtime.prefix_source.service
    for key in service.tier.keys():
        service.tier.remove(key)
    threads = []
    get = service.store.get
    service.store.get = lambda block_id: threads.append(threading.current_thread().name) or get(block_id)
    try:
        before = service.stats()
        tables_runtime.complete(DB, "How many singers?", max_new_tokens=2, tables=["singer", "concert"])
        after = service.stats()
    finally:
        del service.store.get
    assert threads and "headstart-forward" not in threads
    assert after["num_store_hits"] - before["num_store_hits"] == 2
    assert len(service.tier.keys()) == 2  # admitted to the device at the first step
