"""A GGUF file's header read directly: metadata, tensor directory, memory-mapped tensor data.

GGUF v2/v3 (ggml's gguf.md): magic `GGUF`, version, tensor count, key-value
count; the key-values (typed scalars, strings, arrays); the tensor infos
(name, dimensions, ggml type, offset); then the tensor data, aligned
(`general.alignment`, default 32). The `gguf` package's reader builds a
numpy view per element of every array (the 0.5B's tokenizer has 300,000
strings: about 13 s); this reader skips arrays it is not asked for and
reads the header in well under a second. A cut, padded or foreign file
raises `GgufFormatError` with what is wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headstart.models.gguf_formats import BLOCKS, NAMES

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# value types: (struct format, bytes)
SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
           7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
STRING, ARRAY = 8, 9


class GgufFormatError(ValueError):
    """Not a (whole) GGUF file; the message says where it breaks."""


@dataclass
class TensorInfo:
    """One tensor of the directory: `shape` as ggml orders it (ne0 first: the contiguous axis)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int
    data: np.ndarray  # uint8 [rows, row bytes] (1-D tensors: [1, bytes]), memory-mapped

    @property
    def row_length(self) -> int:
        return self.shape[0]


class _Cursor:
    def __init__(self, buffer: memoryview, path: Path):
        self.buffer, self.at, self.path = buffer, 0, path

    def take(self, fmt: str, size: int):
        if self.at + size > len(self.buffer):
            raise GgufFormatError(f"{self.path}: the header ends early (byte {self.at} of {len(self.buffer)})")
        value = struct.unpack_from(fmt, self.buffer, self.at)[0]
        self.at += size
        return value

    def string(self) -> str:
        length = self.take("<Q", 8)
        if self.at + length > len(self.buffer):
            raise GgufFormatError(f"{self.path}: a string runs past the end of the file")
        text = bytes(self.buffer[self.at:self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def skip_string(self) -> None:
        length = self.take("<Q", 8)
        self.at += length


class _LazyArray:
    """An array value read only when asked for (`GgufHeader.value`)."""

    def __init__(self, cursor: _Cursor, start: int, elem_type: int, count: int):
        self.cursor, self.start, self.elem_type, self.count = cursor, start, elem_type, count

    def read(self) -> list:
        c = _Cursor(self.cursor.buffer, self.cursor.path)
        c.at = self.start
        if self.elem_type == STRING:
            return [c.string() for _ in range(self.count)]
        fmt, size = SCALARS[self.elem_type]
        return [c.take(fmt, size) for _ in range(self.count)]


class GgufHeader:
    """The metadata and the tensor directory of a GGUF file; tensor data memory-mapped."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise GgufFormatError(f"{self.path}: cannot be read: {exc}") from exc
        cursor = _Cursor(memoryview(self._map), self.path)
        if len(self._map) < 24 or bytes(self._map[:4]) != MAGIC:
            raise GgufFormatError(f"{self.path} is not a GGUF file (no GGUF magic)")
        cursor.at = 4
        self.version = cursor.take("<I", 4)
        if self.version not in VERSIONS:
            raise GgufFormatError(f"{self.path}: GGUF version {self.version}, read: {VERSIONS}")
        tensors, kvs = cursor.take("<Q", 8), cursor.take("<Q", 8)
        self._values: dict[str, object] = {}
        for _ in range(kvs):
            key = cursor.string()
            self._values[key] = self._value(cursor, cursor.take("<I", 4))
        infos = []
        for _ in range(tensors):
            name = cursor.string()
            dims = tuple(cursor.take("<Q", 8) for _ in range(cursor.take("<I", 4)))
            infos.append((name, dims, cursor.take("<I", 4), cursor.take("<Q", 8)))
        alignment = int(self.value("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = -(-cursor.at // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, ggml_type, offset in infos:
            self.tensors[name] = self._tensor(name, dims, ggml_type, offset)

    def _value(self, cursor: _Cursor, kind: int):
        if kind in SCALARS:
            return cursor.take(*SCALARS[kind])
        if kind == STRING:
            return cursor.string()
        if kind != ARRAY:
            raise GgufFormatError(f"{self.path}: unknown value type {kind} at byte {cursor.at}")
        elem, count = cursor.take("<I", 4), cursor.take("<Q", 8)
        start = cursor.at
        if elem == STRING:
            for _ in range(count):
                cursor.skip_string()
        elif elem in SCALARS:
            cursor.at += SCALARS[elem][1] * count
        else:
            raise GgufFormatError(f"{self.path}: arrays of type {elem} are not read")
        if cursor.at > len(cursor.buffer):
            raise GgufFormatError(f"{self.path}: an array runs past the end of the file")
        return _LazyArray(cursor, start, elem, count)

    def _tensor(self, name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> TensorInfo:
        if ggml_type not in BLOCKS:
            known = ", ".join(NAMES.values())
            raise GgufFormatError(f"{self.path}: tensor {name} has ggml type {ggml_type}; read: {known}")
        elems, size = BLOCKS[ggml_type]
        row = dims[0]
        if row % elems:
            raise GgufFormatError(f"{self.path}: tensor {name}: rows of {row} do not fill {NAMES[ggml_type]} blocks")
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        row_bytes = row // elems * size
        start = self.data_start + offset
        if start + rows * row_bytes > len(self._map):
            raise GgufFormatError(f"{self.path}: tensor {name} ends past the end of the file (truncated)")
        data = self._map[start:start + rows * row_bytes].reshape(rows, row_bytes)
        return TensorInfo(name, dims, ggml_type, offset, rows * row_bytes, data)

    def own_map(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes [rows, row bytes] in a memory map of their own: the pages a
        reader touches there are all this process keeps of the file once the header (and
        its whole-file map) is dropped."""
        t = self.tensors[name]
        rows, row_bytes = t.data.shape
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start + t.offset,
                         shape=(rows, row_bytes))

    def value(self, key: str, default=None):
        """A metadata value (arrays are read now, as lists)."""
        value = self._values.get(key, default)
        return value.read() if isinstance(value, _LazyArray) else value

    def keys(self) -> list[str]:
        return list(self._values)

    @property
    def data_end(self) -> int:
        """Where the last tensor's data ends."""
        return max((self.data_start + t.offset + t.nbytes for t in self.tensors.values()), default=self.data_start)

    @property
    def file_size(self) -> int:
        return len(self._map)
