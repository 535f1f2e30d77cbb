"""The weight store of a GPU run: the frozen tensors in device memory as the file stores them.

QLoRA at rest, on the device. At load every base tensor goes to the GPU once, in its stored type
(the Q4_K, Q8_0, F16... blocks of the file, as uint8 rows), so a model takes about its file size
in device memory. Model code reads it through the same mapping interface as the host
`WeightStore`:

- `weights[name]` of a vector (norms, biases, sinks, the shared-expert gate) or of any bias (gpt-oss's
  expert biases are (E, F) matrices) is float32, kept as such, whatever type the file stores it in
  (F32, F16, BF16, ...);
- of a matrix or an expert stack it is bfloat16 bit patterns (uint16, CuPy has no bfloat16),
  dequantized on the device by `engine.kernels.dequant` into a buffer that a least-recently-used
  cache keeps while its budget allows; the kernels multiply them with fp32 accumulation;
- `dense(name)` is a float32 copy (a tensor trained in full).

Types without a CUDA dequantizer (`kernels.dequant.GPU_TYPES` lists those with one) are
dequantized once on the host at load and kept in device memory as bfloat16. Evicted buffers are
reused for the next tensor of the same shape once nobody holds them; kernels run in stream order,
so a buffer is never overwritten while an earlier kernel still reads it.

`runtime` is an `engine.kernels.runtime.Runtime`: the GPU's, or in tests the g++ emulator's, whose
arrays are NumPy arrays; this module never imports CuPy itself.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import ModelError
from ..kernels.dequant import GPU_TYPES, dequant_on
from .weights import AUTO, TensorMapping, WeightStore, parse_budget

log = logging.getLogger(__name__)

DEVICE_HEADROOM = 0.25  # of the device memory free after the upload, left to activations by "auto"
BF16_EXP = 0x7F80  # exponent bits of a bfloat16: all set is an infinity or a NaN


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest-even), as uint16 bit patterns (on the host)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def device_free_bytes(xp: Any) -> int | None:
    """Free bytes on the current CUDA device (CuPy's pool counted as free), or None off a GPU."""
    cuda = getattr(xp, "cuda", None)
    if cuda is None:
        return None
    free, _total = cuda.runtime.memGetInfo()
    pool = xp.get_default_memory_pool()
    return int(free + pool.free_bytes())


class DeviceWeights(TensorMapping):
    """The base tensors of one model on a device, quantized at rest (see the module docstring)."""

    def __init__(self, host: WeightStore, runtime: Any, budget: str | int | None = AUTO):
        self.host = host
        self.rt = runtime
        self.xp = runtime.xp
        self.path = host.path
        self.dtype = np.dtype(np.float32)  # what activations and vectors are; matrices are bf16
        self.infos = host.infos
        self.row_wise = host.row_wise
        self._names = tuple(host)
        self._vectors: dict[str, Any] = {}
        self._raw: dict[str, Any] = {}  # name -> stored bytes on the device
        self._fixed: dict[str, Any] = {}  # name -> bf16 of a type dequantized on the host
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_bytes = 0
        self._checked: set[str] = set()
        self.hits = self.misses = 0
        self.peak_cache_bytes = 0
        for name, info in self.infos.items():
            if len(info.shape) <= 1 or name.endswith(".bias"):
                self._vectors[name] = self.xp.asarray(np.asarray(host.dense(name), dtype=np.float32))
            elif info.qtype in GPU_TYPES:
                raw = host.file.raw(name)
                self._raw[name] = self.xp.asarray(np.ascontiguousarray(raw))
                host.file.release(raw)
            else:
                self._fixed[name] = self.xp.asarray(_bf16_bits(np.asarray(host.dense(name))))
                host.clear()
        self.stored_bytes = int(
            sum(a.nbytes for d in (self._vectors, self._raw, self._fixed) for a in d.values())
        )
        self.budget = self._resolve(budget)

    # --- Mapping -----------------------------------------------------------------------------
    def __getitem__(self, name: str):
        v = self._vectors.get(name)
        if v is not None:
            return v
        fixed = self._fixed.get(name)
        if fixed is not None:
            return fixed
        if name not in self._raw:
            raise KeyError(name)
        return self._get(name)

    # --- facts and settings --------------------------------------------------------------------
    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    @property
    def dequantized_bytes(self) -> int:
        """Bytes of every matrix as bf16 and every vector as float32 (the whole model dequantized)."""
        return int(sum(i.n_elements * (4 if len(i.shape) <= 1 else 2) for i in self.infos.values()))

    def _resolve(self, budget: str | int | None) -> int:
        value = parse_budget(budget)
        if value != AUTO:
            return int(value)
        free = device_free_bytes(self.xp)
        if free is None:  # an emulated device: as much as the model
            return self.dequantized_bytes
        return int(max(0, free * (1.0 - DEVICE_HEADROOM)))

    def set_budget(self, budget: str | int | None, reserve: int = 0) -> int:
        """Change the cache budget ('auto': the free device memory less a headroom and `reserve`)."""
        value = parse_budget(budget)
        self.budget = self._resolve(budget) if value != AUTO else max(0, self._resolve(AUTO) - reserve)
        self._evict(keep=0)
        return self.budget

    def clear(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0

    # --- reading -----------------------------------------------------------------------------
    def dense(self, name: str):
        """A float32 copy of the whole tensor on the device (a tensor trained in full)."""
        if name in self._vectors:
            return self._vectors[name].copy()
        if name in self._fixed:
            bits = self._fixed[name].astype(self.xp.uint32) << 16
            return bits.view(self.xp.float32)
        if name not in self._raw:
            raise KeyError(name)
        info = self.infos[name]
        return dequant_on(self.rt, self._raw[name], info.qtype, dtype="float32").reshape(info.shape)

    def dequant_into(self, name: str, out) -> None:
        """Write the bf16 bits of matrix or expert stack `name` into `out` (its shape, C-contiguous,
        uint16; a block of rows of a larger buffer): the fused training step's own weight buffers, which the
        cache never hands out or evicts (a captured graph reads them). One launch (a type without
        a CUDA dequantizer: one device copy). No host read."""
        fixed = self._fixed.get(name)
        if fixed is not None:
            out[...] = fixed
            return
        info = self.infos[name]
        dequant_on(self.rt, self._raw[name], info.qtype, out=out.reshape(info.shape), dtype="bfloat16")

    def join(self, names) -> tuple[Any, str] | None:
        """Put the stored blocks of matrices `names` (the same type and row length) one after the
        other in one device buffer, each tensor's own bytes becoming a view of it (no copy kept), and
        return (that buffer, the type): one dequantization launch then writes them all. None when
        they cannot be joined (other types, a type dequantized on the host)."""
        if any(n not in self._raw for n in names):
            return None
        qtypes = {self.infos[n].qtype for n in names}
        widths = {self._raw[n].reshape(self.infos[n].shape[0], -1).shape[1] for n in names}
        if len(qtypes) != 1 or len(widths) != 1:
            return None
        parts = [self._raw[n].reshape(self.infos[n].shape[0], -1) for n in names]
        joined = self.xp.concatenate(parts)
        row = 0
        for n, part in zip(names, parts, strict=True):
            self._raw[n] = joined[row : row + part.shape[0]].reshape(self._raw[n].shape)
            row += part.shape[0]
        return joined, qtypes.pop()

    def _get(self, name: str):
        arr = self._cache.get(name)
        if arr is not None:
            self._cache.move_to_end(name)
            self.hits += 1
            return arr
        self.misses += 1
        info = self.infos[name]
        nbytes = math.prod(info.shape) * 2
        buf = self._reusable(tuple(info.shape), nbytes)
        arr = dequant_on(self.rt, self._raw[name], info.qtype, out=buf, dtype="bfloat16")
        arr = arr.reshape(info.shape)
        self._check_finite(name, arr)
        self._cache[name] = arr
        self._cache_bytes += arr.nbytes
        self.peak_cache_bytes = max(self.peak_cache_bytes, self._cache_bytes)
        self._evict(keep=1)
        return arr

    def _check_finite(self, name: str, bits) -> None:
        """ModelError when a tensor's first dequantization holds an infinity or a NaN (one device
        read per tensor, once per session: the bytes do not change)."""
        if name in self._checked:
            return
        bad = int(((bits & BF16_EXP) == BF16_EXP).sum())
        if bad:
            raise ModelError(
                f"{self.path}: tensor {name!r} holds {bad} NaN or infinite values: the model file is "
                "corrupt; weights must be finite numbers (re-download or re-convert the model)"
            )
        self._checked.add(name)

    def _reusable(self, shape: tuple[int, ...], nbytes: int):
        """A cached buffer of this shape that must go anyway to make room, and that nobody holds."""
        if self._cache_bytes + nbytes <= self.budget:
            return None
        for key in list(self._cache):  # oldest first
            arr = self._cache[key]
            # references when nobody else holds it: the dict's slot, `arr`, getrefcount's argument
            if tuple(arr.shape) == shape and sys.getrefcount(arr) <= 3:
                del self._cache[key]
                self._cache_bytes -= arr.nbytes
                return arr
        return None

    def _evict(self, keep: int = 0) -> None:
        """Drop least recently used buffers until the cache fits; the newest `keep` always stay."""
        if self._cache_bytes <= self.budget:
            return
        for key in list(self._cache)[: max(0, len(self._cache) - keep)]:
            if self._cache_bytes <= self.budget:
                break
            arr = self._cache.pop(key)
            self._cache_bytes -= arr.nbytes
