"""Read-only access to a GGUF file: metadata as plain Python, tensors as NumPy.

The header is parsed here directly (gguf-py's `GGUFReader` builds one NumPy
object per string and needs seconds for a 150k-token vocabulary); tensor data
is memory-mapped and dequantized with `gguf.quants`. Every failure, whether a
missing file, a truncated download, a corrupt header or a tensor type that
cannot be dequantized, surfaces as a `ModelError` naming what was wrong. It
knows nothing about model architectures; `engine.model.archs` and `engine.model.model`
interpret the names and shapes.

Shapes are NumPy order, the reverse of ggml's `ne`: a weight with
ne = [n_in, n_out] is an array (n_out, n_in).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf import quants as gguf_quants

from ..errors import ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's directory entry."""

    name: str  # GGUF tensor name, e.g. "blk.0.attn_q.weight"
    qtype: str  # ggml type name, e.g. "Q4_K", "F32"
    shape: tuple[int, ...]  # NumPy order (reverse of ggml ne)
    n_bytes: int  # bytes on disk

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@functools.lru_cache(maxsize=1)
def dequantizable_types() -> frozenset[str]:
    """Names of the ggml tensor types this installation of gguf-py can turn into float32."""
    ok = set()
    for qtype in GGMLQuantizationType:
        if qtype not in GGML_QUANT_SIZES:
            continue
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            ok.add(qtype.name)
            continue
        try:
            probe = np.zeros((1, type_size), dtype=np.uint8)
            out = gguf_quants.dequantize(probe, qtype)
        except Exception:  # noqa: BLE001 - NotImplementedError, or a type with no float meaning (I8..I64)
            continue
        if out.dtype.kind == "f" and out.size == block_size:
            ok.add(qtype.name)
    return frozenset(ok)


_SCALAR = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


class _Cursor:
    """Reads GGUF header values from a byte buffer, reporting overruns as truncation."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelError(
                f"{self.path}: truncated GGUF header (needed {n} bytes at offset {self.pos}, "
                f"file has {len(self.buf)})"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def peek_item_type(self) -> GGUFValueType | None:
        """The item type of the array whose header starts here, without consuming it."""
        if self.pos + 4 > len(self.buf):
            return None
        try:
            return GGUFValueType(struct.unpack_from("<I", self.buf, self.pos)[0])
        except ValueError:
            return None

    def u32(self) -> int:
        return struct.unpack_from("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        raw = self.take(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            return bytes(raw).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        try:
            t = GGUFValueType(vtype)
        except ValueError as exc:
            raise ModelError(
                f"{self.path}: unknown metadata value type {vtype} at offset {self.pos}"
            ) from exc
        if t == GGUFValueType.STRING:
            return self.string()
        if t == GGUFValueType.ARRAY:
            item_type, count = self.u32(), self.u64()
            if item_type == GGUFValueType.STRING:
                return [self.string() for _ in range(count)]
            if item_type == GGUFValueType.ARRAY:
                return [self.value(self.u32()) for _ in range(count)]
            if item_type not in _SCALAR:
                raise ModelError(f"{self.path}: unknown array item type {item_type} at offset {self.pos}")
            dt = np.dtype(_SCALAR[GGUFValueType(item_type)])
            arr = np.frombuffer(self.take(dt.itemsize * count), dtype=dt)
            return arr.astype(bool).tolist() if item_type == GGUFValueType.BOOL else arr.tolist()
        dt = np.dtype(_SCALAR[t])
        v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0].item()
        return bool(v) if t == GGUFValueType.BOOL else v


class GGUFFile:
    """An open GGUF file. Create with `GGUFFile(path)`; tensors are read lazily."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise ModelError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise ModelError(f"{self.path}: is a folder, expected a .gguf file")
        size = os.path.getsize(self.path)
        if size < 24:
            raise ModelError(f"{self.path}: {size} bytes is too short to be a GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ModelError(f"{self.path}: cannot be read ({exc})") from exc
        cur = _Cursor(memoryview(self._map), self.path)
        cur.take(4)
        self.version = cur.u32()
        if self.version not in (2, 3):
            raise ModelError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = cur.u64(), cur.u64()
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise ModelError(
                f"{self.path}: implausible header ({n_tensors} tensors, {n_kv} keys): corrupt file"
            )
        self.metadata: dict[str, Any] = {}
        # value type per key, and the item type for arrays, so that a file can be re-written exactly
        self.metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.u32()
            sub = cur.peek_item_type() if vtype == GGUFValueType.ARRAY else None
            self.metadata[key] = cur.value(vtype)
            self.metadata_types[key] = (GGUFValueType(vtype), sub)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > 8:
                raise ModelError(f"{self.path}: tensor {name!r} claims {n_dims} dimensions: corrupt file")
            ne = [cur.u64() for _ in range(n_dims)]
            type_id, offset = cur.u32(), cur.u64()
            infos.append((name, ne, type_id, offset))
        alignment = int(self.metadata.get("general.alignment", 32))
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        self._raw: dict[str, np.ndarray] = {}
        for name, ne, type_id, offset in infos:
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError as exc:
                raise ModelError(f"{self.path}: tensor {name!r} has unknown ggml type id {type_id}") from exc
            shape = tuple(int(d) for d in reversed(ne))
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            n_elem = math.prod(shape)  # exact: a corrupt dimension must not wrap around
            if shape and shape[-1] % block_size:
                raise ModelError(
                    f"{self.path}: tensor {name!r} ({qtype.name}) has rows of {shape[-1]} values, "
                    f"not a multiple of the block size {block_size}"
                )
            n_bytes = n_elem // block_size * type_size
            begin = data_start + offset
            if begin + n_bytes > len(self._map):
                raise ModelError(
                    f"{self.path}: tensor {name!r} ({qtype.name}, shape {shape}) needs bytes "
                    f"{begin}..{begin + n_bytes} but the file ends at {len(self._map)}: the file is truncated"
                )
            raw = self._map[begin : begin + n_bytes]
            if qtype == GGMLQuantizationType.F32:
                raw = raw.view(np.float32).reshape(shape)
            elif qtype == GGMLQuantizationType.F16:
                raw = raw.view(np.float16).reshape(shape)
            else:
                raw = raw.reshape(*shape[:-1], shape[-1] // block_size * type_size)
            self.tensors[name] = TensorInfo(name, qtype.name, shape, n_bytes)
            self._raw[name] = raw

    # -- metadata ---------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelError(f"{self.path}: metadata key {key!r} is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    # -- tensors ----------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes or values as stored (memory-mapped, not copied)."""
        if name not in self._raw:
            raise ModelError(f"{self.path}: tensor {name!r} is missing")
        return self._raw[name]

    def load(self, name: str, dtype: np.dtype | type = np.float32) -> np.ndarray:
        """The tensor dequantized to `dtype` (float32, float16 or float64), NumPy shape."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelError(f"{self.path}: tensor {name!r} is missing")
        if info.qtype not in dequantizable_types():
            raise ModelError(
                f"{self.path}: tensor {name!r} has type {info.qtype}, which cannot be dequantized; "
                f"supported types: {', '.join(sorted(dequantizable_types()))}"
            )
        raw = self._raw[name]
        qtype = GGMLQuantizationType[info.qtype]
        if qtype == GGMLQuantizationType.F32:
            out = np.asarray(raw, dtype=np.float32).reshape(info.shape)
        elif qtype == GGMLQuantizationType.F16:
            out = np.asarray(raw, dtype=np.float16).reshape(info.shape)
        else:
            out = gguf_quants.dequantize(raw, qtype).reshape(info.shape)
        return out.astype(dtype, copy=True)

    def release(self, view: np.ndarray) -> None:
        """Let the kernel drop this process's resident pages of `view` (a slice of the mapping).

        The bytes stay in the page cache and a later read maps them back (a minor fault), so
        tensors that were just dequantized stop counting against the process's resident memory.
        A no-op where madvise is unavailable (Windows) or `view` is not part of the mapping.
        """
        mm = getattr(self._map, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or view.size == 0:
            return
        base = self._map.ctypes.data
        start = view.ctypes.data - base
        length = view.nbytes if view.flags.c_contiguous else None
        if length is None or start < 0 or start + length > self._map.nbytes:
            return
        page = mmap.PAGESIZE
        lo = (start + page - 1) // page * page  # whole pages inside the view only: its neighbours
        hi = (start + length) // page * page  # may be in use
        if hi > lo:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        self._raw.clear()
        self._map = None  # type: ignore[assignment]

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
