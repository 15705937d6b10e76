"""Block keys, schema hashes, `TableBlock` validation and the safetensors codec."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct

import pytest
import torch
from safetensors import safe_open

from headstart.schema.model import Column, ForeignKey, Schema, Table
from headstart.tables.block import BlockError, TableBlock
from headstart.tables.block_codec import FORMAT, BlockCodecError, decode_block, encode_block, read_metadata
from headstart.tables.keys import BlockId, BlockScope, is_index_key, sanitize, schema_hash
from tests.tables_blocks import fresh_scope, make_block

HASH = "0f" * 32


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ("concert_singer", "concert_singer"),
        ("Qwen2.5-Coder-0.5B", "Qwen2.5-Coder-0.5B"),
        ("Qwen/Qwen2.5", "Qwen_Qwen2.5~" + hashlib.sha256(b"Qwen/Qwen2.5").hexdigest()[:8]),
    ],
)
def test_sanitize(part, expected):
    assert sanitize(part) == expected


def test_sanitize_keeps_names_distinct_and_rejects_empty():
    assert sanitize("a/b") != sanitize("a_b") == "a_b"
    assert sanitize("a b") != sanitize("a/b")
    with pytest.raises(ValueError, match="empty"):
        sanitize("")


def test_keys_carry_the_whole_namespace():
    scope = BlockScope("Qwen/Qwen2.5", "bfloat16", "concert_singer", HASH)
    model = sanitize("Qwen/Qwen2.5")
    assert scope.block_id("singer").key == f"headstart:tables:v1:{model}:bfloat16:concert_singer:{HASH}:singer"
    assert scope.index_key == f"headstart:tables:v1:{model}:bfloat16:concert_singer:{HASH}:#index"
    assert is_index_key(scope.index_key) and not is_index_key(scope.block_id("#index").key)
    assert scope.block_id("stadium").scope == scope
    assert BlockId("m", "float16", "db", HASH, "t").key != BlockId("m", "bfloat16", "db", HASH, "t").key


def _schema(**changes) -> Schema:
    singer = Table("singer", (Column("id", "int", True), Column("name", "text")), ("id",))
    concert = Table("concert", (Column("id", "int"), Column("singer_id", "int")), ("id",),
                    (ForeignKey(("singer_id",), "singer", ("id",)),))
    base = Schema("concert_singer", (singer, concert), source="/tmp/a.sqlite", extras={"x": 1})
    return dataclasses.replace(base, **changes)


def test_schema_hash_is_stable_sha256():
    h = schema_hash(_schema())
    assert h == schema_hash(_schema()) and len(h) == 64 and int(h, 16) >= 0
    assert schema_hash(_schema(source="elsewhere", extras={"y": 2})) == h


@pytest.mark.parametrize(
    "change",
    [
        {"db_id": "other"},
        {"tables": tuple(reversed(_schema().tables))},
        {"tables": (_schema().tables[0],)},
        {"tables": (dataclasses.replace(_schema().tables[0], primary_key=()), _schema().tables[1])},
        {"tables": (_schema().tables[0], dataclasses.replace(_schema().tables[1], foreign_keys=()))},
        {"tables": (dataclasses.replace(_schema().tables[0], columns=(Column("id", "int"), Column("name", "text"))),
                    _schema().tables[1])},
    ],
    ids=["db", "table order", "table dropped", "primary key", "foreign key", "not null"],
)
def test_schema_hash_changes_with_structure(change):
    assert schema_hash(_schema(**change)) != schema_hash(_schema())


def test_schema_hash_render_tag():
    assert schema_hash(_schema(), render_tag="v2") != schema_hash(_schema())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_codec_round_trip(dtype):
    scope = fresh_scope(dtype)
    block = dataclasses.replace(
        make_block(scope, "singer", 5, seed=3, dtype=dtype, group=2, position_offset=17),
        group_tables=("stadium", "singer"), extra={"renderer": "v1"},
    )
    back = decode_block(encode_block(block))
    assert back.block_id == block.block_id
    assert (back.token_ids, back.group, back.group_tables, back.position_offset, back.extra) == (
        (300, 301, 302, 303, 304), 2, ("stadium", "singer"), 17, {"renderer": "v1"})
    assert back.keys_pre_rope.dtype == dtype and back.keys_pre_rope.shape == (2, 1, 5, 4)
    assert torch.equal(back.keys_pre_rope, block.keys_pre_rope) and torch.equal(back.values, block.values)


def test_encoding_is_deterministic():
    block = make_block(fresh_scope(), "singer", 4)
    assert len({encode_block(block) for _ in range(10)}) == 1


def test_layout_is_plain_safetensors(tmp_path):
    block = make_block(fresh_scope(), "singer", 4)
    data = encode_block(block)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    assert sorted(header) == ["__metadata__", "keys_pre_rope", "token_ids", "values"]
    assert header["token_ids"]["dtype"] == "I64" and header["values"]["shape"] == [2, 1, 4, 4]
    path = tmp_path / "b.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        assert list(meta) == [FORMAT]
        assert json.loads(meta[FORMAT])["table"] == "singer" and json.loads(meta[FORMAT])["version"] == 1
        assert torch.equal(f.get_tensor("token_ids"), torch.arange(4))
    assert read_metadata(data) == meta


def _reencode(block: TableBlock, meta_patch: dict | None = None, drop: str | None = None, fmt: str = FORMAT) -> bytes:
    from safetensors.torch import save

    meta = json.loads(read_metadata(encode_block(block))[FORMAT]) | (meta_patch or {})
    tensors = {"keys_pre_rope": block.keys_pre_rope, "values": block.values,
               "token_ids": torch.tensor(block.token_ids, dtype=torch.int64)}
    tensors.pop(drop, None)
    return save(tensors, metadata={fmt: json.dumps(meta)})


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda b: b"", "too short"),
        (lambda b: encode_block(b)[:40], "does not fit"),
        (lambda b: struct.pack("<Q", 4) + b"nope", "unreadable safetensors header"),
        (lambda b: encode_block(b)[:-8], "unreadable block"),
        (lambda b: _reencode(b, fmt="other"), r"not a table block: metadata keys \['other'\]"),
        (lambda b: _reencode(b, {"version": 2}), "version 2, expected 1"),
        (lambda b: _reencode(b, drop="values"), r"lacks tensors \['values'\]"),
        (lambda b: _reencode(b, {"num_tokens": 9}), "num_tokens 9"),
        (lambda b: _reencode(b, {"dtype": "float16"}), "inconsistent block"),
        (lambda b: _reencode(b, {"group": "x"}), "mistypes"),
    ],
    ids=["empty", "truncated header", "bad json", "truncated data", "format", "version", "missing tensor", "count",
         "dtype", "type"],
)
def test_decode_rejects(make, match):
    with pytest.raises(BlockCodecError, match=match):
        decode_block(make(make_block(fresh_scope(), "singer", 3)))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"values": torch.zeros(2, 1, 4, 4)}, "differ"),
        ({"keys_pre_rope": torch.zeros(2, 3, 4), "values": torch.zeros(2, 3, 4)}, "must be"),
        ({"dtype": "bfloat16"}, "dtype"),
        ({"token_ids": (1, 2)}, "2 token ids for 3"),
        ({"token_ids": (), "keys_pre_rope": torch.zeros(2, 1, 0, 4), "values": torch.zeros(2, 1, 0, 4)},
         "at least one"),
        ({"position_offset": -1}, ">= 0"),
        ({"group_tables": ("other",)}, "not among"),
    ],
)
def test_block_validation(change, match):
    block = make_block(fresh_scope(), "singer", 3)
    with pytest.raises(BlockError, match=match):
        dataclasses.replace(block, **change)


def test_block_sizes_and_moves():
    block = make_block(fresh_scope(), "singer", 3)
    assert block.num_bytes == 2 * 2 * 1 * 3 * 4 * 4 and block.num_tokens == 3
    assert block.to("cpu") is block
    meta = block.to("meta")
    assert meta.device.type == "meta" and meta.token_ids == block.token_ids and meta.key == block.key
