"""The weight store: a model's frozen tensors kept as the file stores them, dequantized on demand.

QLoRA at rest. The GGUF file is memory-mapped and every base tensor stays in its stored type
(Q4_K, Q8_0, F16, ...). Model code reads weights through this store as through a dict of arrays:

- `store[name]` gives a dense array of a 1-D or 2-D tensor, dequantized when it is asked for;
- expert stacks (E, n_out, n_in) come as an `ExpertStack`: `stack[e]` dequantizes one expert,
  so a MoE layer reads only the experts its batch routes to;
- tensors read by rows (the token embedding, the output head) come as a `RowTensor`:
  `take_rows(ids)` dequantizes only those rows (get_rows), `row_chunks()` walks the vocabulary
  in blocks of rows.

Dequantized arrays are kept in a least-recently-used cache of at most `budget` bytes (plus a
working set: one layer's tensors, which the forward and backward of that layer need anyway).
A budget large enough for the whole model makes a small model run as fast as one dequantized
at load; a small one lets a 7B model train in a few GiB. Evicted buffers are reused for the next
tensor of the same shape (never while anyone still holds them), so a pass over the layers does
not allocate. 1-D tensors (norms, biases) are dequantized once at load and always kept.

`parse_budget` and `resolve_budget` turn the user's setting ("auto", "off", "2G", bytes) into
bytes; "auto" is what is free (the system's available memory, or the cgroup's limit when lower)
minus what the run needs besides the cache and a headroom. This module knows GGUF tensor names
only by the two row-wise roles it is told about; it does not know architectures.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError, ModelError
from ..kernels.blockq import BlockQ
from ..kernels.blockq_cpu import transposed_cpu
from ..kernels.cpu_workers import on_worker
from ..kernels.dequant_cpu import codes_kernel
from .gguf_file import GGUFFile, TensorInfo
from .quants import dequantize, int_code_group, int_codes

log = logging.getLogger(__name__)

AUTO = "auto"
ROW_WISE = ("token_embd.weight", "output.weight")  # read by rows: get_rows and the output head
ROW_CHUNK_BYTES = 16 << 20  # dequantized bytes per block when a row-wise tensor is walked
HEADROOM_FRACTION = 0.10  # of total memory, kept free by "auto"
HEADROOM_MIN = 1 << 30
_ROWS = object()  # the `part` of rows taken by id: checked on every read
MAX_WEIGHT = 1e15  # a weight this large (real ones stay under 1e5) is bytes that are not weights


# --- budget ----------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(value: str | int | float | None) -> int | str:
    """'auto', or bytes from an int or text: '0'/'off'/'none' (no cache), '512M', '2.5G', '1T'."""
    if value is None:
        return AUTO
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            raise EngineError(f"cache budget must be 0 or more bytes, got {value}")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise EngineError(f"cache budget must be a finite number of bytes >= 0, got {value}")
        return int(value)
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return AUTO
    if text in ("off", "none", "0"):
        return 0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", text)
    if not m:
        raise EngineError(
            f"cache budget {value!r} is not understood; use auto, off, or a size such as 512M, 4G, 2.5G"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def memory_available() -> int:
    """Bytes a new allocation can use now: MemAvailable, bounded by a cgroup limit if one is set."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = _windows_available()
    limit = _cgroup_room()
    if limit is not None:
        avail = min(avail, limit) if avail is not None else limit
    return int(avail or 0)


def memory_total() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return memory_available()


def _cgroup_room() -> int | None:
    """Room left under a cgroup v2 memory limit (containers), or None when there is no limit."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            raw = f.read().strip()
        if raw == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            used = int(f.read().strip())
        return max(0, int(raw) - used)
    except (OSError, ValueError):
        return None


def _windows_available() -> int | None:
    if sys.platform != "win32":
        return None
    import ctypes

    class MEMORYSTATUSEX(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("sullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    st = MEMORYSTATUSEX()
    st.dwLength = ctypes.sizeof(MEMORYSTATUSEX)
    if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)):  # type: ignore[attr-defined]
        return int(st.ullAvailPhys)
    return None


def auto_headroom() -> int:
    return max(HEADROOM_MIN, int(memory_total() * HEADROOM_FRACTION))


def resolve_budget(value: str | int | float | None, reserve: int = 0) -> int:
    """Bytes for the cache: a fixed size as given, or 'auto' = available - reserve - headroom."""
    b = parse_budget(value)
    if b != AUTO:
        return int(b)
    return max(0, memory_available() - int(reserve) - auto_headroom())


# --- the store -------------------------------------------------------------------------------------


@dataclass
class StoreStats:
    """Counters for benchmarks and the memory estimate (reset with `reset`)."""

    dequant_seconds: float = 0.0  # time spent dequantizing
    dequant_values: int = 0  # values dequantized
    hits: int = 0  # reads served from the cache
    misses: int = 0  # reads that dequantized
    peak_cache_bytes: int = 0  # most bytes the cache held at once

    def reset(self) -> None:
        self.dequant_seconds = 0.0
        self.dequant_values = self.hits = self.misses = self.peak_cache_bytes = 0


class TensorMapping(Mapping):
    """A model's tensors by name, in file order: `_names` (the order) and `infos` (name -> TensorInfo)
    are the subclass's; `__getitem__` gives a tensor its way (WeightStore, DeviceWeights)."""

    _names: tuple[str, ...]
    infos: Mapping[str, TensorInfo]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self.infos


class WeightStore(TensorMapping):
    """The base tensors of one model file, quantized at rest, dequantized on demand (see module doc)."""

    def __init__(
        self,
        gguf: GGUFFile,
        names: Iterable[str],
        dtype=np.float32,
        budget: str | int | float | None = AUTO,
        *,
        row_wise: Iterable[str] = ROW_WISE,
    ):
        self.file = gguf
        self.path = gguf.path
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ModelError(f"weights are dequantized to float32 or float64, not {self.dtype}")
        self._names = tuple(dict.fromkeys(names))
        missing = [n for n in self._names if n not in gguf.tensors]
        if missing:
            raise ModelError(f"{self.path}: tensor {missing[0]!r} is missing")
        self.infos: dict[str, TensorInfo] = {n: gguf.tensors[n] for n in self._names}
        self.row_wise = frozenset(n for n in row_wise if n in self.infos)
        self._lock = threading.RLock()
        # (name, expert or None) and ("rows", names): float arrays; ("codes", name, expert, transposed):
        # an expert's codes (`expert_codes`)
        self._cache: OrderedDict[tuple, np.ndarray | BlockQ] = OrderedDict()
        self._cache_bytes = 0
        self.stats = StoreStats()
        self._pinned: dict[str, np.ndarray] = {}
        self._finite: set[tuple[str, object]] = set()  # (tensor, part) whose values were checked finite
        self._layer_matrices: dict[int, list[str]] = {}  # layer -> its 2-D and 3-D tensors (prefetch_layer)
        for n, info in self.infos.items():
            if len(info.shape) <= 1:
                self._pinned[n] = self._dequantize(gguf.raw(n), info.qtype, info.shape, name=n)
        self.working_set = self._working_set_bytes()
        # the cache with every expert as codes in both layouts (1 byte a value and two float32 per
        # group, twice) and every other matrix dequantized (`expert_codes`)
        groups = [(i, int_code_group(i.qtype)) for i in self.infos.values() if len(i.shape) == 3]
        self._codes_bytes = self.dequantized_bytes + sum(
            2 * (i.n_elements + 8 * i.n_elements // g) - i.n_elements * self.dtype.itemsize
            for i, g in groups
            if g
        )
        self.budget = resolve_budget(budget)

    # --- Mapping -----------------------------------------------------------------------------
    def __getitem__(self, name: str):
        if name in self._pinned:
            return self._pinned[name]
        info = self.infos.get(name)
        if info is None:
            raise KeyError(name)
        if len(info.shape) == 3:
            return ExpertStack(self, name)
        if name in self.row_wise:
            return RowTensor(self, name)
        return self._get(name, None)

    # --- facts -------------------------------------------------------------------------------
    @property
    def stored_bytes(self) -> int:
        """Bytes of the tensors as the file stores them."""
        return int(sum(i.n_bytes for i in self.infos.values()))

    @property
    def dequantized_bytes(self) -> int:
        """Bytes of every tensor dequantized (what a float copy of the model would take)."""
        return int(sum(i.n_elements for i in self.infos.values()) * self.dtype.itemsize)

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    @property
    def codes_bytes(self) -> int:
        """Bytes of the cache holding every expert stack that has codes as int8 codes in both layouts
        (2.5 or 3 bytes a value) and every other tensor dequantized: the budget from which
        `expert_codes` keeps both layouts (under it, the file's layout made on each use, no
        transpose)."""
        return self._codes_bytes

    def set_budget(self, budget: str | int | float | None, reserve: int = 0) -> int:
        """Change the cache budget ('auto' is computed now, keeping `reserve` bytes for the run)."""
        with self._lock:
            self.budget = resolve_budget(budget, reserve)
            self._evict(0)
        return self.budget

    def prefetch_layer(self, i: int) -> None:
        """Start reading layer i's stored matrices from storage in the background (GGUFFile.prefetch),
        when the cache cannot hold the model: a step then reads the next layer's bytes from disk while
        it computes this one, instead of waiting on page faults in the middle of the layer (measured on
        a Qwen3-30B-A3B-shaped file larger than the page cache: bench/CPU_NOTES.md). Tensors cached
        dequantized are skipped; a no-op when the budget holds the whole model."""
        if self.budget >= self.dequantized_bytes:
            return
        names = self._layer_matrices.get(i)
        if names is None:
            prefix = f"blk.{i}."
            names = self._layer_matrices[i] = [
                n for n, info in self.infos.items() if n.startswith(prefix) and len(info.shape) >= 2
            ]
        self.file.prefetch([self.file.raw(n) for n in names if (n, None) not in self._cache])

    def clear(self) -> None:
        """Drop every cached dequantized tensor (pinned vectors stay)."""
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0

    def _working_set_bytes(self) -> int:
        """Bytes of the largest layer's 2-D tensors plus three experts: held anyway while it runs."""
        per_layer: dict[str, int] = {}
        expert = 0
        for n, info in self.infos.items():
            if n in self.row_wise or len(info.shape) < 2:
                continue
            m = re.match(r"blk\.(\d+)\.", n)
            key = m.group(1) if m else ""
            if len(info.shape) == 3:
                expert = max(expert, math.prod(info.shape[1:]))
                continue
            per_layer[key] = per_layer.get(key, 0) + info.n_elements
        values = max(per_layer.values(), default=0) + 3 * expert
        return values * self.dtype.itemsize

    # --- reading -----------------------------------------------------------------------------
    def dense(self, name: str) -> np.ndarray:
        """The whole tensor as one array, whatever its role (exports, full-weight copies)."""
        if name in self._pinned:
            return self._pinned[name]
        if name not in self.infos:
            raise KeyError(name)
        return self._get(name, None)

    def expert(self, name: str, e: int) -> np.ndarray:
        """Expert e of a stack (E, n_out, n_in) as (n_out, n_in)."""
        info = self.infos[name]
        if not 0 <= e < info.shape[0]:
            raise IndexError(f"{name}: expert {e} out of range 0..{info.shape[0] - 1}")
        return self._get(name, int(e))

    def expert_codes(self, name: str, e: int, transposed: bool = False) -> BlockQ | None:
        """Expert e of a stack (E, n_out, n_in) as int8 codes with a scale and offset per group of 32 or
        16 (engine.kernels.blockq), what the CPU's expert products multiply by without a float copy
        (engine.kernels.moe_cpu): in the file's layout (1.25 or 1.5 bytes a value), or `transposed`
        (the backward's, made from the first; the same size). Each cached as an entry of its own.

        Where the cache budget holds every expert's codes beside the other tensors dequantized
        (`codes_bytes`), both layouts, made once and kept. Where it does not (a model larger than its
        cache), the file's layout made on each use where a compiled kernel makes it
        (engine.kernels.dequant_cpu.codes_kernel: a 768 x 2048 Q4_K expert's codes in 0.06 ms,
        against 0.11 ms to dequantize it, and the product from codes is the faster), and no
        transpose: made on each use it costs (0.35 ms) what the product from codes saves, so the
        backward multiplies by the float expert. None also where the stored type has no such codes
        (engine.io.quants.int_codes), the store dequantizes to float64, or n_out is not a multiple of
        4 (the kernel's row blocks)."""
        info = self.infos[name]
        if not 0 <= e < info.shape[0]:
            raise IndexError(f"{name}: expert {e} out of range 0..{info.shape[0] - 1}")
        group = int_code_group(info.qtype)
        if self.dtype != np.float32 or group is None:
            return None
        if info.shape[1] % 4 or info.shape[2] % group:
            return None
        if self.budget < self._codes_bytes and (transposed or codes_kernel(info.qtype) is None):
            return None
        key = ("codes", name, int(e), transposed)
        with self._lock:
            held = self._cached(key)
        if held is not None:
            return held
        # made outside the lock, as `_get` dequantizes: CPU workers make their experts' side by side
        if transposed:
            made = transposed_cpu(self.expert_codes(name, e))
        else:
            t = time.perf_counter()
            raw = self.file.raw(name)[e]
            q, s, m, _ = int_codes(raw, info.qtype)
            made = BlockQ(q, s, m, "in", group)
            part = ("expert", int(e))
            if (name, part) not in self._finite:  # once per expert, as for its float values
                self._check_finite(made.dense(), name, part)
            self.file.release(raw)
            with self._lock:
                self.stats.dequant_seconds += time.perf_counter() - t
        with self._lock:
            self.stats.misses += 1
            return self._insert(key, made)

    def rows_of(self, names: Iterable[str]) -> list[np.ndarray]:
        """2-D tensors with the same number of columns (a layer's q, k, v; gate and up), dequantized as
        consecutive row blocks of one array, which is cached as one entry: the list of blocks, in
        order. A CPU twin multiplies by the whole array at once (engine.kernels.linear_cpu)."""
        names = tuple(names)
        key = ("rows", names)
        with self._lock:
            whole = self._cached(key)
            if whole is None:
                infos = [self.infos[n] for n in names]
                shape = (sum(i.shape[0] for i in infos), infos[0].shape[1])
                if any(len(i.shape) != 2 or i.shape[1] != shape[1] for i in infos):
                    raise ValueError(f"{names}: not 2-D tensors with the same number of columns")
                self.stats.misses += 1
                nbytes = math.prod(shape) * self.dtype.itemsize
                whole = self._reusable(shape, nbytes)
                if whole is None:
                    whole = np.empty(shape, self.dtype)
                lo = 0
                for n, info in zip(names, infos, strict=True):
                    out = whole[lo : lo + info.shape[0]]
                    self._dequantize(self.file.raw(n), info.qtype, info.shape, out=out, name=n)
                    lo += info.shape[0]
                self._insert(key, whole)
        blocks, lo = [], 0
        for n in names:
            rows = self.infos[n].shape[0]
            blocks.append(whole[lo : lo + rows])
            lo += rows
        return blocks

    def take_rows(self, name: str, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` (any shape of ids) of a 2-D tensor: (*idx.shape, n_in), only those dequantized."""
        key = (name, None)
        with self._lock:
            full = self._cache.get(key)
        if full is not None:
            return full[idx]
        info = self.infos[name]
        idx = np.asarray(idx)
        flat = idx.reshape(-1)
        uniq, inverse = np.unique(flat, return_inverse=True)
        raw = self.file.raw(name)
        rows = self._dequantize(raw[uniq], info.qtype, (uniq.size, info.shape[-1]), name=name, part=_ROWS)
        return rows[inverse].reshape(*idx.shape, info.shape[-1])

    def row_chunks(
        self, name: str, max_bytes: int = ROW_CHUNK_BYTES
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """(lo, hi, rows lo..hi) covering a 2-D tensor: the whole cached tensor when it fits the
        budget, else blocks of at most `max_bytes` dequantized into one reused buffer."""
        info = self.infos[name]
        n_rows, n_in = info.shape
        if self.fits_whole(name, max_bytes):
            yield 0, n_rows, self._get(name, None)
            return
        step = max(1, max_bytes // (n_in * self.dtype.itemsize))
        raw = self.file.raw(name)
        buf = np.empty((step, n_in), self.dtype)
        for lo in range(0, n_rows, step):
            hi = min(n_rows, lo + step)
            out = buf[: hi - lo]
            self._dequantize(raw[lo:hi], info.qtype, out.shape, out=out, name=name, part=("rows", lo))
            yield lo, hi, out

    def fits_whole(self, name: str, max_bytes: int = ROW_CHUNK_BYTES) -> bool:
        """Whether a row-wise tensor is (or may be) kept dequantized whole rather than streamed."""
        info = self.infos[name]
        whole = info.n_elements * self.dtype.itemsize
        with self._lock:
            if (name, None) in self._cache or (info.qtype == "F32" and self.dtype == np.float32):
                return True
            return whole <= max(self.budget - self._cache_bytes, max_bytes)

    def _get(self, name: str, e: int | None) -> np.ndarray:
        key = (name, e)
        with self._lock:
            arr = self._cached(key)
            if arr is not None:
                return arr
            info = self.infos[name]
            shape = info.shape if e is None else info.shape[1:]
            raw = self.file.raw(name) if e is None else self.file.raw(name)[e]
            part = None if e is None else ("expert", e)  # what _check_finite remembers as checked
            if info.qtype == "F32" and self.dtype == np.float32:
                # stored as float32 already: the memory-mapped values themselves (no copy to cache)
                self.stats.hits += 1
                arr = raw.reshape(shape)
                self._check_finite(arr, name, part)
                return arr
            self.stats.misses += 1
            nbytes = math.prod(shape) * self.dtype.itemsize
            buf = self._reusable(shape, nbytes)  # out of the cache: this call's own
        # outside the lock: CPU workers dequantize their experts side by side, and one waiting on the
        # disk (a page fault of the mapping) holds up nobody else
        arr = self._dequantize(raw, info.qtype, shape, out=buf, name=name, part=part)
        with self._lock:
            return self._insert(key, arr)

    def _cached(self, key: tuple) -> np.ndarray | BlockQ | None:
        """The cache's entry for key, now its most recently used (the caller holds the lock), or None."""
        value = self._cache.get(key)
        if value is not None:
            self._cache.move_to_end(key)
            self.stats.hits += 1
        return value

    def _insert(self, key: tuple, value):
        """Cache value under key and make room (the caller holds the lock); returns what the cache
        holds for key: the entry another thread made meanwhile, if one did (one copy is kept)."""
        held = self._cache.get(key)
        if held is not None:
            self._cache.move_to_end(key)
            return held
        self._cache[key] = value
        self._cache_bytes += value.nbytes
        self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, self._cache_bytes)
        self._evict(keep=1)
        return value

    def _limit(self) -> int:
        return self.budget + self.working_set

    def _reusable(self, shape: tuple[int, ...], nbytes: int) -> np.ndarray | None:
        """A cached buffer of this shape that must go anyway to make room, and that nobody holds."""
        if self._cache_bytes + nbytes <= self._limit():
            return None
        for key in list(self._cache):  # oldest first
            arr = self._cache[key]
            if not isinstance(arr, np.ndarray):  # an expert's codes: no float buffer to reuse
                continue
            # references when nobody else holds it: the dict's slot, `arr`, getrefcount's argument
            if arr.shape == shape and sys.getrefcount(arr) <= 3:
                del self._cache[key]
                self._cache_bytes -= arr.nbytes
                return arr
        return None

    def _evict(self, keep: int = 0) -> None:
        """Drop least recently used entries until the cache fits; the newest `keep` always stay."""
        limit = self._limit()
        if self._cache_bytes <= limit:
            return
        for key in list(self._cache)[: max(0, len(self._cache) - keep)]:
            if self._cache_bytes <= limit:
                break
            arr = self._cache.pop(key)
            self._cache_bytes -= arr.nbytes

    def _dequantize(
        self, raw, qtype: str, shape, out: np.ndarray | None = None, *, name: str = "", part: object = None
    ) -> np.ndarray:
        """Dequantize stored bytes into `out` (or a new array), then let their pages go (see
        GGUFFile.release): the weights at rest live in the page cache, not in this process.

        The values of tensor `name` (its `part`: an expert, a block of rows) are checked finite the
        first time they are dequantized (see `_check_finite`).
        """
        t = time.perf_counter()
        threads = 1 if on_worker() else None  # CPU workers dequantize side by side, one thread each
        if self.dtype == np.float32:
            y = dequantize(
                raw, qtype, out=out if out is not None and out.dtype == np.float32 else None, threads=threads
            )
        else:
            y = dequantize(raw, qtype).astype(self.dtype)
            if out is not None:
                out[...] = y.reshape(out.shape)
                y = out
        y = y.reshape(shape)
        if name:
            self._check_finite(y, name, part)
        if isinstance(raw, np.memmap) or getattr(raw, "base", None) is not None:
            self.file.release(raw)
        with self._lock:
            self.stats.dequant_seconds += time.perf_counter() - t
            self.stats.dequant_values += y.size
        return y

    def _check_finite(self, values: np.ndarray, name: str, part: object) -> None:
        """ModelError naming the tensor when `values` hold a NaN, an infinity or a magnitude of
        `MAX_WEIGHT` or more: bytes that are not weights (a corrupt file).

        Once per tensor part: the bytes do not change, so a part dequantized again (after eviction,
        the next step's head block) is not checked again; rows taken by id are checked every time.
        One pass, the sum of squares (a few percent of a dequantization; none on later reads),
        which is NaN, infinite or over MAX_WEIGHT**2 when any value is; only then are they searched.
        """
        key = (name, part)
        if key in self._finite:
            return
        flat = values.reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):  # a NaN or an overflow is the finding
            total = float(np.dot(flat, flat))
        if not total <= MAX_WEIGHT * MAX_WEIGHT:
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(values) < MAX_WEIGHT)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                expert = isinstance(part, tuple) and part[0] == "expert"
                what = f"expert {part[1]} of tensor" if expert else "tensor"
                raise ModelError(
                    f"{self.path}: {what} {name!r} holds {values[where]} at index {list(where)} "
                    f"({int(bad.sum())} values are NaN, infinite or beyond ±{MAX_WEIGHT:.0e}): the model "
                    "file is corrupt; weights must be finite numbers (re-download or re-convert the model)"
                )
        if part is not _ROWS:
            self._finite.add(key)


class _StoredTensor:
    """A tensor of the store read in parts, with the array facts (shape, dtype, ndim) of the whole."""

    ndim: int

    def __init__(self, store: WeightStore, name: str):
        self.store, self.name = store, name
        info = store.infos[name]
        self.shape = info.shape
        self.qtype = info.qtype
        self.dtype = store.dtype


class ExpertStack(_StoredTensor):
    """An expert stack (E, n_out, n_in) in the store: `stack[e]` dequantizes expert e only."""

    ndim = 3

    def __getitem__(self, e) -> np.ndarray:
        if isinstance(e, (int, np.integer)):
            return self.store.expert(self.name, int(e))
        return np.asarray(self)[e]

    def __len__(self) -> int:
        return self.shape[0]

    def codes(self, e: int, transposed: bool = False) -> BlockQ | None:
        """Expert e as int8 codes, or their transpose (`WeightStore.expert_codes`), or None."""
        return self.store.expert_codes(self.name, int(e), transposed)

    def __array__(self, dtype=None, copy=None):
        out = self.store.dense(self.name)
        return out if dtype is None else out.astype(dtype)


class RowTensor(_StoredTensor):
    """A 2-D tensor read by rows (embedding, output head): `take_rows(ids)` and `row_chunks()`."""

    ndim = 2

    def take_rows(self, idx: np.ndarray) -> np.ndarray:
        return self.store.take_rows(self.name, idx)

    def row_chunks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        return self.store.row_chunks(self.name)

    def fits_in_memory(self) -> bool:
        return self.store.fits_whole(self.name)

    def __getitem__(self, idx) -> np.ndarray:
        return np.asarray(self)[idx]

    def __array__(self, dtype=None, copy=None):
        out = self.store.dense(self.name)
        return out if dtype is None else out.astype(dtype)
