"""Shared pytest configuration: fixtures that several test files use, and how the suite is split
over pytest-xdist's workers (`./run.sh test` runs two; `HEADSTART_TEST_WORKERS=0` none)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.pg_fixture", "tests.redis_fixture", "tests.engine_fixture", "tests.serve_fixture"]

# A test file that starts a Ray cluster or a whole local stack (the session's `serve_engine`, a
# `headstart loadtest` or `serve` subprocess). All such files run on one worker, one after the
# other: one cluster at a time, mostly waiting on its processes, beside the engine's CPU-bound
# tests on the other worker. Every other file is a group of its own (its module fixtures, a loaded
# model say, are built once).
_STACK = re.compile(r"serve_engine|serve_stack|make_gateway|start_ray|ray_stack|_run_loadtest|local_stack|local_cluster|"
                    r"^import ray|^from ray", re.MULTILINE)


def pytest_collection_modifyitems(config, items):
    stack_files: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in stack_files:
            stack_files[path] = bool(_STACK.search(item.path.read_text(errors="replace")))
        item.add_marker(pytest.mark.xdist_group("stack" if stack_files[path] else item.path.stem))


_worker_tmpdir: str | None = None


def pytest_configure(config):
    """Under xdist: this worker's temporary files (its processes' and their children's) in a folder of its own.

    A test that looks in the temporary folder for what its own engine made there (a data session's
    working copy) must not find what the other worker's tests made at the same moment."""
    global _worker_tmpdir
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _worker_tmpdir = tempfile.mkdtemp(prefix=f"hs-{worker}-")  # short: socket paths may live here
        # traversable, not listable: the local PostgreSQL fixture runs as an unprivileged user under it
        os.chmod(_worker_tmpdir, 0o711)
        os.environ["TMPDIR"] = _worker_tmpdir
        tempfile.tempdir = None  # computed anew from TMPDIR


def pytest_unconfigure(config):
    if _worker_tmpdir:
        shutil.rmtree(_worker_tmpdir, ignore_errors=True)
