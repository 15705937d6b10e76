"""Bytes <-> `TableBlock`, in the safetensors format (never pickle).

Layout of an encoded block (a standard safetensors buffer, readable by any
safetensors implementation):

    [8 bytes]  N, little-endian u64: length of the JSON header
    [N bytes]  JSON header, UTF-8:
                 {"keys_pre_rope": {"dtype", "shape", "data_offsets"},
                  "values":        {...},
                  "token_ids":     {...},
                  "__metadata__":  {"headstart.table_block": "<JSON, below>"}}
    [rest]     raw little-endian tensor data at the given offsets

Tensors:
    keys_pre_rope  [layers, kv_heads, tokens, head_dim], the block's dtype,
                   keys before rotary position encoding
    values         [layers, kv_heads, tokens, head_dim], the block's dtype
    token_ids      [tokens], int64

The one metadata entry, `headstart.table_block`, is a JSON object (sorted
keys; safetensors metadata is str -> str):
    version (1), model_id, dtype, db_id, schema_hash, table, group,
    group_tables, position_offset, num_tokens, extra (str -> str)
NOTE: one entry, not several: safetensors writes metadata from a hash map in
an unspecified order, and a single entry keeps the bytes of a block
deterministic (the same block always encodes to the same bytes).

Decoding checks the entry and its version, the tensors' presence and the
consistency of every field; any mismatch raises `BlockCodecError`.
"""

from __future__ import annotations

import json
import struct

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from headstart.tables.block import BlockError, TableBlock

FORMAT = "headstart.table_block"
VERSION = 1
_TENSORS = ("keys_pre_rope", "values", "token_ids")
_MAX_HEADER = 1 << 24  # a header beyond 16 MiB is corrupt, not a table


class BlockCodecError(ValueError):
    """Bytes are not a valid encoded block (truncated, wrong format, inconsistent)."""


def encode_block(block: TableBlock) -> bytes:
    """Serialize `block` (tensors are copied to CPU first when they are elsewhere)."""
    meta = {
        "version": VERSION,
        "model_id": block.model_id,
        "dtype": block.dtype,
        "db_id": block.db_id,
        "schema_hash": block.schema_hash,
        "table": block.table,
        "group": block.group,
        "group_tables": list(block.group_tables),
        "position_offset": block.position_offset,
        "num_tokens": block.num_tokens,
        "extra": dict(block.extra),
    }
    tensors = {
        "keys_pre_rope": block.keys_pre_rope.detach().to("cpu").contiguous(),
        "values": block.values.detach().to("cpu").contiguous(),
        "token_ids": torch.tensor(block.token_ids, dtype=torch.int64),
    }
    return st_save(tensors, metadata={FORMAT: json.dumps(meta, sort_keys=True)})


def read_metadata(data: bytes) -> dict[str, str]:
    """The safetensors `__metadata__` of an encoded block, without reading tensors."""
    if len(data) < 8:
        raise BlockCodecError(f"{len(data)} bytes: too short for a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise BlockCodecError(f"header length {n} does not fit in {len(data)} bytes")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BlockCodecError(f"unreadable safetensors header: {exc}") from exc
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise BlockCodecError("no __metadata__ in the safetensors header")
    return metadata


def decode_block(data: bytes) -> TableBlock:
    """Parse bytes written by `encode_block` into a CPU `TableBlock`.

    Raises:
        BlockCodecError: the bytes are not a block of this format and version.
    """
    metadata = read_metadata(data)
    if FORMAT not in metadata:
        raise BlockCodecError(f"not a table block: metadata keys {sorted(metadata)}, expected {FORMAT!r}")
    try:
        meta = json.loads(metadata[FORMAT])
        tensors = st_load(bytes(data))
    except (json.JSONDecodeError, SafetensorError) as exc:
        raise BlockCodecError(f"unreadable block: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        version = meta.get("version") if isinstance(meta, dict) else None
        raise BlockCodecError(f"block format version {version!r}, expected {VERSION}")
    missing = [name for name in _TENSORS if name not in tensors]
    if missing:
        raise BlockCodecError(f"block lacks tensors {missing}")
    token_ids = tensors["token_ids"]
    if token_ids.dim() != 1 or token_ids.dtype != torch.int64:
        raise BlockCodecError(f"token_ids must be 1-d int64, got {token_ids.dtype} {tuple(token_ids.shape)}")
    try:
        if meta["num_tokens"] != token_ids.numel():
            raise BlockCodecError(f"num_tokens {meta['num_tokens']} but {token_ids.numel()} token ids")
        return TableBlock(
            model_id=meta["model_id"],
            dtype=meta["dtype"],
            db_id=meta["db_id"],
            schema_hash=meta["schema_hash"],
            table=meta["table"],
            token_ids=tuple(token_ids.tolist()),
            keys_pre_rope=tensors["keys_pre_rope"],
            values=tensors["values"],
            group=meta["group"],
            group_tables=tuple(meta["group_tables"]),
            position_offset=meta["position_offset"],
            extra=dict(meta.get("extra", {})),
        )
    except (KeyError, TypeError) as exc:
        raise BlockCodecError(f"block metadata lacks or mistypes {exc}") from exc
    except BlockError as exc:
        raise BlockCodecError(f"inconsistent block: {exc}") from exc
