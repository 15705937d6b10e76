"""The P0 cache store: base-prompt KV caches keyed by SHA-256, in memory and on disk.

The key covers everything that determines the keys/values: the model id, the
dtype and the P0 token ids. A second session on the same database finds its
P0 here and starts without prefill. On disk a P0 cache is one safetensors
file: tensors `k.{layer}` / `v.{layer}` `# [1, kv_heads, tokens, head_dim]`
and `ids` `# [tokens]` int64 — never pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from headstart.engine.kv.state import KVState, state_from_layers

log = logging.getLogger(__name__)


def p0_key(model_id: str, dtype_name: str, ids: list[int]) -> str:
    """SHA-256 over (model id, dtype, P0 token ids): deterministic across processes."""
    payload = json.dumps({"model": model_id, "dtype": dtype_name, "ids": ids}, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


class P0Store:
    """Memory LRU (bounded by entries) in front of an optional disk directory."""

    def __init__(self, directory: Path | None, max_entries: int = 16, max_disk_entries: int = 256):
        self.directory = Path(directory) if directory else None
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.max_entries = max_entries
        self.max_disk_entries = max_disk_entries  # oldest files go first (clients choose table orders)
        self._memory: OrderedDict[str, KVState] = OrderedDict()
        self._lock = threading.Lock()
        self.hits_memory = 0
        self.hits_disk = 0
        self.misses = 0

    def get(self, key: str, device: torch.device) -> KVState | None:
        """The stored state (shared: callers copy before extending) or None."""
        with self._lock:
            state = self._memory.get(key)
            if state is not None:
                self._memory.move_to_end(key)
                self.hits_memory += 1
                return state
        state = self._load(key, device)
        if state is None:
            self.misses += 1
            return None
        self.hits_disk += 1
        self._remember(key, state)
        return state

    def states(self) -> list[KVState]:
        """The P0 caches held in memory (for KV accounting)."""
        with self._lock:
            return list(self._memory.values())

    def put(self, key: str, state: KVState) -> None:
        self._remember(key, state)
        if self.directory:
            self._save(key, state)

    def _remember(self, key: str, state: KVState) -> None:
        with self._lock:
            self._memory[key] = state
            self._memory.move_to_end(key)
            while len(self._memory) > self.max_entries:
                self._memory.popitem(last=False)

    def _path(self, key: str) -> Path:
        return self.directory / f"p0-{key}.safetensors"

    def _save(self, key: str, state: KVState) -> None:
        tensors = {"ids": torch.tensor(state.ids, dtype=torch.int64)}
        for i, (keys, values) in enumerate(state.cache.layers):
            tensors[f"k.{i}"] = keys.detach().to("cpu").contiguous()
            tensors[f"v.{i}"] = values.detach().to("cpu").contiguous()
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            save_file(tensors, str(tmp), metadata={"format": "headstart-p0-v1"})
            os.replace(tmp, path)  # atomic: readers never see a half-written file
            self._trim_disk()
        except OSError as exc:  # a full disk must not fail the session
            log.warning("could not persist P0 cache %s: %s", key[:12], exc)
            tmp.unlink(missing_ok=True)

    def _trim_disk(self) -> None:
        files = sorted(self.directory.glob("p0-*.safetensors"), key=lambda f: f.stat().st_mtime)
        for old in files[: max(0, len(files) - self.max_disk_entries)]:
            old.unlink(missing_ok=True)

    def _load(self, key: str, device: torch.device) -> KVState | None:
        if not self.directory:
            return None
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            tensors = load_file(str(path), device=str(device))
        except Exception as exc:  # a corrupt file is a miss, and is removed
            log.warning("dropping unreadable P0 cache %s: %s", path, exc)
            path.unlink(missing_ok=True)
            return None
        num_layers = sum(1 for name in tensors if name.startswith("k."))
        return state_from_layers(tensors["ids"].tolist(), [(tensors[f"k.{i}"], tensors[f"v.{i}"])
                                                           for i in range(num_layers)])
