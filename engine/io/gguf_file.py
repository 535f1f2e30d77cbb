"""Read-only access to a GGUF file: metadata as plain Python, tensors as NumPy.

The header is parsed here directly (gguf-py's `GGUFReader` builds one NumPy
object per string and needs seconds for a 150k-token vocabulary); tensor data
is memory-mapped and dequantized with `gguf.quants`. Every failure, whether a
missing file, a truncated download, a corrupt header or a tensor type that
cannot be dequantized, surfaces as a `ModelError` naming what was wrong: counts
and lengths are checked against the bytes left in the file before anything is
read or allocated, and the alignment, tensor offsets (aligned, inside the file,
not overlapping) and names (no duplicates) as llama.cpp checks them. It knows
nothing about model architectures; `engine.model.archs` and `engine.model.model`
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
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf import quants as gguf_quants

from ..errors import ModelError
from .file_kind import file_kind

log = logging.getLogger(__name__)

_MAX_ALIGNMENT = 1 << 30  # general.alignment above this is corrupt (files use 32)
_MAX_ELEMENTS = 1 << 50  # values in one tensor (with zero dimensions counted as 1): beyond, corrupt


def _q(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: names and values in messages come from the file."""
    text = repr(value[: limit + 1] if isinstance(value, (str, list)) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_bytes_in_words(magic: bytes) -> str:
    """What a file's first bytes are, for a person: 'it starts with "hell"' or its hex bytes."""
    if magic and all(32 <= b < 127 for b in magic):
        return f'it starts with "{magic.decode("ascii")}"'
    return "it starts with the bytes " + " ".join(f"{b:02x}" for b in magic)


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


# The ggml tensor types this engine reads, by type code: (name, values per block, bytes per block),
# as ggml defines them (ggml.c's type_traits). A tensor of any other code is refused, naming it: the
# code decides how many bytes a tensor takes, so a code read wrongly would read the wrong bytes.
KNOWN_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
}  # fmt: skip
# Codes ggml has defined that hold nothing this engine can use as weights, and why.
_UNUSABLE_TYPES: dict[int, str] = {
    4: "Q4_2, removed from ggml in 2023", 5: "Q4_3, removed from ggml in 2023",
    9: "Q8_1, an intermediate type of ggml's matrix products, never stored as weights",
    15: "Q8_K, an intermediate type of ggml's matrix products, never stored as weights",
    24: "I8, integers, not weights", 25: "I16, integers, not weights", 26: "I32, integers, not weights",
    27: "I64, integers, not weights", 28: "F64, which this engine does not read",
    31: "Q4_0_4_4, removed from ggml (repacked in memory now)",
    32: "Q4_0_4_8, removed from ggml (repacked in memory now)",
    33: "Q4_0_8_8, removed from ggml (repacked in memory now)",
    36: "IQ4_NL_4_4, removed from ggml", 37: "IQ4_NL_4_8, removed from ggml",
    38: "IQ4_NL_8_8, removed from ggml",
}  # fmt: skip


def type_problem(type_id: int) -> str | None:
    """Why a tensor of ggml type code `type_id` cannot be read (None: it can)."""
    if type_id in KNOWN_TYPES:
        return None
    if type_id in _UNUSABLE_TYPES:
        return f"type code {type_id} is {_UNUSABLE_TYPES[type_id]}"
    known = ", ".join(f"{name} ({code})" for code, (name, _, _) in sorted(KNOWN_TYPES.items()))
    return f"type code {type_id} is not a ggml type this engine knows (it reads {known})"


@functools.lru_cache(maxsize=1)
def dequantizable_types() -> frozenset[str]:
    """Names of the known ggml tensor types (`KNOWN_TYPES`) this installation of gguf-py can turn
    into float32."""
    ok = set()
    names = {name for name, _, _ in KNOWN_TYPES.values()}
    for qtype in GGMLQuantizationType:
        if qtype not in GGML_QUANT_SIZES or qtype.name not in names:
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


# Fewest bytes one array item of each type takes: a declared count is checked against what is left
# of the file before anything is read or allocated.
_MIN_ITEM_BYTES = {
    **{t: np.dtype(code).itemsize for t, code in _SCALAR.items()},
    GGUFValueType.STRING: 8,  # its length
    GGUFValueType.ARRAY: 12,  # item type and count
}
_MAX_ARRAY_NESTING = 8  # arrays of arrays (llama.cpp writes none; gguf-py reads them)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


class _Cursor:
    """Reads GGUF header values from a byte buffer, reporting overruns as truncation."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

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

    def string(self, what: str = "string") -> str:
        at = self.pos
        n = self.u64()
        if n > self.left:
            raise ModelError(
                f"{self.path}: {what} at offset {at} declares {n} bytes but only {self.left} are left "
                "in the file: the file is truncated or corrupt"
            )
        raw = self.take(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            return bytes(raw).decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        """One metadata value of type `vtype`, the value of `key` (named in error messages)."""
        try:
            t = GGUFValueType(vtype)
        except ValueError as exc:
            raise ModelError(
                f"{self.path}: metadata {_q(key)} has unknown value type {vtype} at offset {self.pos} "
                f"(known: 0..{max(GGUFValueType)}): corrupt file"
            ) from exc
        if t == GGUFValueType.STRING:
            return self.string(f"metadata {_q(key)}")
        if t == GGUFValueType.ARRAY:
            at = self.pos
            item_type, count = self.u32(), self.u64()
            try:
                it = GGUFValueType(item_type)
            except ValueError as exc:
                raise ModelError(
                    f"{self.path}: metadata {_q(key)} is an array of unknown item type {item_type} "
                    f"at offset {at} (known: 0..{max(GGUFValueType)}): corrupt file"
                ) from exc
            if count * _MIN_ITEM_BYTES[it] > self.left:
                raise ModelError(
                    f"{self.path}: metadata {_q(key)} at offset {at} declares {count} {it.name} items, "
                    f"more than the {self.left} bytes left in the file can hold: the file is truncated "
                    "or corrupt"
                )
            if it == GGUFValueType.STRING:
                return [self.string(f"item of metadata {_q(key)}") for _ in range(count)]
            if it == GGUFValueType.ARRAY:
                if depth >= _MAX_ARRAY_NESTING:
                    raise ModelError(
                        f"{self.path}: metadata {_q(key)} nests arrays more than {_MAX_ARRAY_NESTING} "
                        f"deep at offset {at}: corrupt file"
                    )
                return [self.value(it, key, depth + 1) for _ in range(count)]
            dt = np.dtype(_SCALAR[it])
            arr = np.frombuffer(self.take(dt.itemsize * count), dtype=dt)
            return arr.astype(bool).tolist() if it == GGUFValueType.BOOL else arr.tolist()
        dt = np.dtype(_SCALAR[t])
        v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0].item()
        return bool(v) if t == GGUFValueType.BOOL else v


class GGUFFile:
    """An open GGUF file. Create with `GGUFFile(path)`; tensors are read lazily."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise ModelError(f"{self.path}: no such file") from None
        except OSError as exc:
            raise ModelError(f"{self.path}: cannot be read ({exc.strerror or exc})") from exc
        if stat.S_ISDIR(st.st_mode):
            raise ModelError(f"{self.path}: is a folder, expected a .gguf file")
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
            raise ModelError(f"{self.path}: is {file_kind(st.st_mode)}, not a file; expected a .gguf file")
        size = st.st_size
        if size < 24:
            raise ModelError(f"{self.path}: {size} bytes is too short to be a GGUF file")
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ModelError(f"{self.path}: cannot be read ({exc.strerror or exc})") from exc
        if magic != b"GGUF":
            what = _first_bytes_in_words(magic)
            raise ModelError(f"{self.path}: not a GGUF file ({what}; a GGUF file starts with GGUF)")
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
        if n_tensors * _MIN_TENSOR_INFO_BYTES + n_kv * _MIN_KV_BYTES > cur.left:
            raise ModelError(
                f"{self.path}: implausible header ({n_tensors} tensors, {n_kv} keys do not fit in "
                f"{len(self._map)} bytes): corrupt file"
            )
        self.metadata: dict[str, Any] = {}
        # value type per key, and the item type for arrays, so that a file can be re-written exactly
        self.metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for _ in range(n_kv):
            at = cur.pos
            key = cur.string("metadata key")
            if key in self.metadata:
                raise ModelError(f"{self.path}: metadata key {_q(key)} appears twice (again at offset {at})")
            vtype = cur.u32()
            sub = cur.peek_item_type() if vtype == GGUFValueType.ARRAY else None
            self.metadata[key] = cur.value(vtype, key)
            self.metadata_types[key] = (GGUFValueType(vtype), sub)
        infos = []
        for _ in range(n_tensors):
            at = cur.pos
            name = cur.string("tensor name")
            n_dims = cur.u32()
            if n_dims > _MAX_DIMS:
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} claims {n_dims} dimensions (at most {_MAX_DIMS}): "
                    "corrupt file"
                )
            ne = [cur.u64() for _ in range(n_dims)]
            type_id, offset = cur.u32(), cur.u64()
            infos.append((name, ne, type_id, offset, at))
        alignment = self._alignment()
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        self._raw: dict[str, np.ndarray] = {}
        self._prefetcher: Prefetcher | None = None  # made by the first `prefetch`
        extents = []  # (begin, end, name) of each tensor's bytes
        for name, ne, type_id, offset, at in infos:
            if name in self.tensors:
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} appears twice in the tensor directory (again at "
                    f"offset {at}): corrupt file"
                )
            problem = type_problem(type_id)
            if problem is not None:
                raise ModelError(f"{self.path}: tensor {_q(name)} cannot be read: {problem}")
            type_name, block_size, type_size = KNOWN_TYPES[type_id]
            shape = tuple(int(d) for d in reversed(ne))
            n_elem = math.prod(shape)  # exact: a corrupt dimension must not wrap around
            if math.prod(max(d, 1) for d in shape) > _MAX_ELEMENTS:
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} claims shape {shape} ({n_elem} values), more than any "
                    "file holds: the file is corrupt or truncated"
                )
            row = shape[-1] if shape else 1
            if row % block_size:
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} ({type_name}) has rows of {row} values, "
                    f"not a multiple of the block size {block_size}"
                )
            if offset % alignment:
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} starts at data offset {offset}, which is not a "
                    f"multiple of the alignment {alignment}: corrupt file"
                )
            n_bytes = n_elem // block_size * type_size
            begin = data_start + offset
            if begin + n_bytes > len(self._map):
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} ({type_name}, shape {shape}) needs bytes "
                    f"{begin}..{begin + n_bytes} but the file ends at {len(self._map)}: the file is truncated"
                )
            raw = self._map[begin : begin + n_bytes]
            if type_name == "F32":
                raw = raw.view(np.float32).reshape(shape)
            elif type_name == "F16":
                raw = raw.view(np.float16).reshape(shape)
            else:
                raw = raw.reshape(*shape[:-1], row // block_size * type_size)
            self.tensors[name] = TensorInfo(name, type_name, shape, n_bytes)
            self._raw[name] = raw
            if n_bytes:
                extents.append((begin, begin + n_bytes, name))
        extents.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(extents, extents[1:], strict=False):
            if b1 < e0:
                raise ModelError(
                    f"{self.path}: tensors {_q(n0)} (bytes {b0}..{e0}) and {_q(n1)} (bytes {b1}..{e1}) "
                    "overlap: corrupt file"
                )
        self._check_layout(infos, alignment, data_start)

    def _check_layout(self, infos: list, alignment: int, data_start: int) -> None:
        """Tensor data back to back in directory order, each padded to the alignment, as llama.cpp
        requires (gguf.cpp: "tensor has offset X, expected Y"), and the file ending with the last
        one: so every tensor spans exactly the bytes its type code and shape give it. A type code
        changed to that of another type (another block size) fails here, naming the tensor."""
        expected = 0
        previous = None
        for name, _ne, _type_id, offset, _at in infos:
            if offset != expected:
                after = (
                    f"tensor {_q(previous.name)} ({previous.qtype}, shape {previous.shape}) takes "
                    f"{previous.n_bytes} bytes, so the next starts at {expected}"
                    if previous is not None
                    else "the first tensor starts at data offset 0"
                )
                raise ModelError(
                    f"{self.path}: tensor {_q(name)} starts at data offset {offset}, but {after}: a type "
                    "code or shape does not match the stored bytes (corrupt file)"
                )
            previous = self.tensors[name]
            expected += -(-previous.n_bytes // alignment) * alignment
        if previous is not None:
            end_min = (
                data_start + expected - (-(-previous.n_bytes // alignment) * alignment) + previous.n_bytes
            )
            end_max = data_start + expected
            if not end_min <= len(self._map) <= end_max:
                raise ModelError(
                    f"{self.path}: the file has {len(self._map) - end_max} bytes after the data of its last "
                    f"tensor {_q(previous.name)} ({previous.qtype}, shape {previous.shape}, "
                    f"{previous.n_bytes} bytes): its type code or shape does not match the stored bytes "
                    "(corrupt file)"
                )

    def _alignment(self) -> int:
        """general.alignment: a power of two (32 when absent), as llama.cpp requires."""
        value = self.metadata.get("general.alignment", 32)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 < value <= _MAX_ALIGNMENT
            or value & (value - 1)
        ):
            raise ModelError(
                f"{self.path}: general.alignment is {_q(value)}; expected a power of two from 1 to "
                f"{_MAX_ALIGNMENT} (32 when absent)"
            )
        return value

    # -- metadata ---------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelError(f"{self.path}: metadata key {_q(key)} is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    # -- tensors ----------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes or values as stored (memory-mapped, not copied)."""
        if name not in self._raw:
            raise ModelError(f"{self.path}: tensor {_q(name)} is missing")
        return self._raw[name]

    def load(self, name: str, dtype: np.dtype | type = np.float32) -> np.ndarray:
        """The tensor dequantized to `dtype` (float32, float16 or float64), NumPy shape."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelError(f"{self.path}: tensor {_q(name)} is missing")
        if info.qtype not in dequantizable_types():
            raise ModelError(
                f"{self.path}: tensor {_q(name)} has type {info.qtype}, which cannot be dequantized; "
                f"supported types: {', '.join(sorted(dequantizable_types()))}"
            )
        raw = self._raw[name]
        if info.qtype == "F32":
            out = np.asarray(raw, dtype=np.float32).reshape(info.shape)
        elif info.qtype == "F16":
            out = np.asarray(raw, dtype=np.float16).reshape(info.shape)
        else:
            out = gguf_quants.dequantize(raw, GGMLQuantizationType[info.qtype]).reshape(info.shape)
        return out.astype(dtype, copy=True)

    def prefetch(self, views: Sequence[np.ndarray]) -> None:
        """Start reading the bytes of `views` (slices of the mapping: one layer's matrices) from
        storage in the background, so that reads a little later find them in the page cache
        (`Prefetcher`: one thread reading the file; MADV_WILLNEED was measured to read nothing ahead
        here). The views are one job: ranges that touch or nearly touch are read as one. A no-op where
        os.preadv is missing (not Linux); views that are not part of the mapping are skipped."""
        if not hasattr(os, "preadv"):
            return
        base, size = self._map.ctypes.data, self._map.nbytes
        ranges = sorted(
            (v.ctypes.data - base, v.nbytes)
            for v in views
            if v.size and v.flags.c_contiguous and 0 <= v.ctypes.data - base <= size - v.nbytes
        )
        spans: list[tuple[int, int]] = []
        for start, n in ranges:
            if spans and start <= spans[-1][0] + spans[-1][1] + Prefetcher.GAP:
                s0, n0 = spans[-1]
                spans[-1] = (s0, max(n0, start + n - s0))
            else:
                spans.append((start, n))
        if spans:
            if self._prefetcher is None:
                self._prefetcher = Prefetcher(self.path)
            self._prefetcher.read(spans)

    def _advise(self, view: np.ndarray, advice: int | None) -> None:
        """madvise the whole pages inside `view` (its neighbours may be in use)."""
        mm = getattr(self._map, "_mmap", None)
        if advice is None or mm is None or not hasattr(mm, "madvise") or view.size == 0:
            return
        base = self._map.ctypes.data
        start = view.ctypes.data - base
        length = view.nbytes if view.flags.c_contiguous else None
        if length is None or start < 0 or start + length > self._map.nbytes:
            return
        page = mmap.PAGESIZE
        lo = (start + page - 1) // page * page
        hi = (start + length) // page * page
        if hi > lo:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(advice, lo, hi - lo)

    def release(self, view: np.ndarray) -> None:
        """Let the kernel drop this process's resident pages of `view` (a slice of the mapping).

        The bytes stay in the page cache and a later read maps them back (a minor fault), so
        tensors that were just dequantized stop counting against the process's resident memory.
        A no-op where madvise is unavailable (Windows) or `view` is not part of the mapping.
        """
        self._advise(view, getattr(mmap, "MADV_DONTNEED", None))

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self._raw.clear()
        self._map = None  # type: ignore[assignment]

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Prefetcher:
    """One background thread that brings byte ranges of a file into the page cache, so that the
    engine finds them there when it maps them a moment later (engine.io.weights' prefetch_layer: the
    next layer's weights while this one computes). A job is one layer's ranges, loaded in order; at
    most `PENDING` jobs wait, and a newer one pushes out the oldest that has not started (it would
    arrive too late).

    Where the system has posix_fadvise, each `CHUNK` is asked for with POSIX_FADV_WILLNEED: the
    kernel reads it in the background and nothing is copied (one call for a whole range reads only
    the readahead window, so the ranges go in chunks). Elsewhere the thread reads the chunks into a
    scratch buffer (os.preadv), which costs a copy: measured as 16% of the CPU of a Qwen3-30B-A3B
    step with the cache off. Both give the interpreter lock away, so the engine's threads run on."""

    PENDING = 2
    CHUNK = 4 << 20
    GAP = 64 << 10  # ranges this close are loaded as one (the gap costs less than another request)

    def __init__(self, path: str) -> None:
        import collections
        import threading

        self._fd = os.open(path, os.O_RDONLY)
        self._buf = None if hasattr(os, "posix_fadvise") else memoryview(bytearray(self.CHUNK))
        self._jobs: collections.deque[tuple[tuple[int, int], ...]] = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gguf-prefetch", daemon=True)
        self._thread.start()

    def _load(self, start: int, length: int) -> None:
        """Bring one chunk into the page cache."""
        if self._buf is None:
            os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_WILLNEED)
        else:
            os.preadv(self._fd, [self._buf[:length]], start)

    def read(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Queue one job: the (start, length) ranges, read in this order."""
        job = tuple(ranges)
        with self._cv:
            if job in self._jobs:
                return
            self._jobs.append(job)
            while len(self._jobs) > self.PENDING:
                self._jobs.popleft()
            self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job waits or runs (False when `timeout` passed first)."""
        with self._cv:
            return self._cv.wait_for(lambda: self._closed or (not self._jobs and not self._busy), timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._jobs.popleft()
                self._busy = True
            with contextlib.suppress(OSError):
                for start, length in job:
                    for off in range(start, start + length, self.CHUNK):
                        if self._closed:
                            return
                        self._load(off, min(self.CHUNK, start + length - off))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._jobs.clear()
            self._cv.notify_all()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._fd)
