"""Dequantization: raw GGUF blocks to float32 (or bfloat16), the NumPy reference and the CUDA kernels.

`dequant_ref(raw, qtype)` is the specification: `gguf.quants.dequantize`, on the raw layout that
`GGUFFile.raw()` gives (uint8 `(..., row_bytes)`, or float16/float32 values for F16/F32), every type
gguf-py can dequantize. `dequant(raw_dev, qtype, out=None, dtype="float32")` is its CuPy twin for the
weight store: raw blocks already in device memory become float32 values bit-for-bit equal to the
reference (the kernels round every multiply and add separately, as NumPy does, and never flush
subnormals), or bfloat16 values that are exactly the reference rounded to nearest-even. One call
dequantizes one layer, or one expert group: an (E, n_out, row_bytes) stack, whole or gathered by
expert ids (`rows=`), into a reusable `out` buffer.

GPU types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS, MXFP4 (`GPU_TYPES`). Every other type (the IQ1/IQ2/IQ3 families, TQ1_0/TQ2_0, NVFP4, ...)
has no kernel: the weight store dequantizes such a tensor once on the host with `dequant_ref` and
keeps the result.

Not here: choosing what to dequantize when, caching, or memory budgets (the weight store's work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from .nvrtc import KernelSource
from .runtime import Runtime, array_module, cuda_runtime

# the types with a CUDA kernel, in the order of the kernel source
GPU_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
)
OUT_DTYPES = ("float32", "bfloat16")

THREADS = 256  # threads per CUDA block, for every type
VALUES_PER_THREAD = 8  # each thread writes 8 consecutive values: 2 float4 stores, or 1 16-byte bf16 store
TILE_VALUES = THREADS * VALUES_PER_THREAD  # values per CUDA block (2048)

# 4-bit codebooks, as in gguf-py (a test holds these equal to gguf.quants)
IQ4_NL_KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1, doubled


def block_geometry(qtype: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type name; ValueError for an unknown name."""
    return GGML_QUANT_SIZES[_ggml_type(qtype)]


def _ggml_type(qtype: str) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType[qtype]
    except KeyError:
        names = ", ".join(t.name for t in GGMLQuantizationType)
        raise ValueError(f"unknown ggml type {qtype!r}; known: {names}") from None


# ----------------------------------------------------------------------------------------------
# reference


def dequant_ref(raw: np.ndarray, qtype: str, rows: Any = None) -> np.ndarray:
    """float32 values of raw GGUF data (`gguf.quants.dequantize`): shape (..., n_values_per_row).

    `raw` is uint8 (..., row_bytes) as `GGUFFile.raw()` gives it, or float16/float32 values for
    F16/F32. `rows` (optional) picks entries of the first axis first, as `raw[rows]`: the experts
    of an (E, n_out, row_bytes) stack.
    """
    q = _ggml_type(qtype)
    data = np.asarray(raw)
    if rows is not None:
        data = data[np.asarray(rows, dtype=np.intp)]
    data = np.ascontiguousarray(data)
    if data.ndim == 0:
        raise ValueError(f"raw data for {qtype} must have at least one axis, got a scalar")
    out = gguf_quants.dequantize(data, q)
    return np.array(out, dtype=np.float32, copy=True) if q == GGMLQuantizationType.F32 else out


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Design (memory-bound: the floor is bytes read + bytes written over bandwidth; the output
# dominates, 4 bytes per float32 value against 0.53..1.06 bytes per quantized value):
# - One CUDA block of 256 threads owns a tile of 2048 consecutive output values of one slice
#   (a whole tensor, or one gathered expert). Its raw bytes are a contiguous run of whole blocks,
#   2048 / QK blocks of TS bytes, which the threads copy into shared memory with 16-byte loads
#   (`uint4`), coalesced: consecutive threads read consecutive 16-byte words. Most block sizes are
#   not multiples of 16 bytes (Q4_0 18, Q8_0 34, MXFP4 17, Q6_K 210), so loading whole blocks per
#   thread could not use 16-byte loads; staging the tile can, from the 16-byte boundary at or below
#   its first byte (`shift`), whatever the alignment of a gathered expert or row.
# - Then each thread decodes 8 consecutive values of the tile from shared memory and writes them
#   with 16-byte stores (two float4, or one uint4 of 8 bf16), coalesced across the warp; a thread
#   whose 8 values end the slice, or whose address is not 16-byte aligned, stores one by one.
#   8 values never straddle a sub-block: every scale and bit position is fixed per thread.
# - Per type, the tile is (QK values, TS bytes per block; tile bytes; 16-byte loads per thread):
#     F32   1, 4:   8192 B, 2    F16/BF16 1, 2: 4096 B, 1
#     Q8_0  32, 34: 2176 B, 0.53 Q4_0/IQ4_NL 32, 18: 1152 B, 0.28   Q4_1 32, 20: 1280 B, 0.31
#     Q5_0  32, 22: 1408 B, 0.34 Q5_1 32, 24: 1536 B, 0.38          MXFP4 32, 17: 1088 B, 0.27
#     Q2_K 256, 84:  672 B, 0.16 Q3_K 256, 110: 880 B, 0.21         Q4_K 256, 144: 1152 B, 0.28
#     Q5_K 256, 176: 1408 B, 0.34 Q6_K 256, 210: 1680 B, 0.41       IQ4_XS 256, 136: 1088 B, 0.27
#   Every tile is a whole number of 16-byte words, so aligned slices need no extra word. 2048
#   values per block keep the grid large (a 4096 x 4096 layer is 8192 blocks over 132 SMs) and
#   the shared stage at most 8 KB. ptxas (NVRTC 13.5, sm_80 and sm_90) gives every kernel 40
#   registers, no stack and no spills: 6 blocks (1536 threads) per SM; capping at 32 registers
#   (8 blocks) spilled 24 bytes, so there is no cap.
# - Grid: one dimension, n_slices * tiles_per_slice blocks; block b is tile b % tiles_per_slice
#   of slice b // tiles_per_slice, whose source is ids[slice] when gathering. An id outside
#   [0, n_src_slices) writes NaN over its slice instead of reading out of bounds (no host sync).
# - Exactness: f16 scales are converted exactly, and each operation follows gguf-py's order
#   (e.g. Q4_K: (d * sc) * q - (dmin * m)). Products and sums use __fmul_rn/__fadd_rn/__fsub_rn,
#   so NVRTC never contracts `a * b - c` into one FMA where NumPy rounds twice. (Today every
#   product that a sum follows is exact anyway, at most 11 + 6 + 5 significant bits, so an FMA
#   would round the same; the intrinsics keep that true by construction, not by arithmetic.)
#   Compiled without -ftz, so subnormals survive: MXFP4 scale bytes 0 and 1, F32/BF16 inputs.
# The floor, e.g. a 4096 x 4096 Q4_K layer: 9.4 MB read + 67 MB written (float32) at ~3.35 TB/s
# on an H100 is ~23 us; to bfloat16, 9.4 + 33.5 MB, ~13 us. Not yet timed: no version has run
# on a GPU so far.


def _table_words(values: tuple[int, ...]) -> str:
    """16 signed bytes as the 4 little-endian words of a `make_uint4(...)`."""
    raw = np.array(values, dtype=np.int8).view(np.uint8)
    return ", ".join(f"0x{int(w):08x}u" for w in raw.view("<u4"))


def kernel_name(qtype: str, dtype: str) -> str:
    """The CUDA kernel for one type and output dtype, e.g. dequant_q4_k_bf16."""
    return f"dequant_{qtype.lower()}_{'f32' if dtype == 'float32' else 'bf16'}"


SOURCE = KernelSource.from_file(
    "dequant.cu",
    kernels=tuple(kernel_name(t, d) for t in GPU_TYPES for d in OUT_DTYPES),
    defines={
        "THREADS": THREADS,
        "VALUES_PER_THREAD": VALUES_PER_THREAD,
        "KV_IQ4NL": f"make_uint4({_table_words(IQ4_NL_KVALUES)})",
        "KV_MXFP4": f"make_uint4({_table_words(MXFP4_KVALUES)})",
    },
)
SOURCES = (SOURCE,)


@dataclass(frozen=True)
class DequantPlan:
    """The launch of one `dequant` call, worked out on the host from shapes alone."""

    shape: tuple[int, ...]  # the output's shape
    n_src: int  # slices of the raw data (experts when gathering, else 1)
    n_slices: int  # slices of the output (len(rows) when gathering, else 1)
    slice_values: int  # values per output slice
    src_slice_bytes: int  # raw bytes per source slice
    tiles: int  # CUDA blocks per slice, TILE_VALUES values each (the last may be partial)

    @property
    def grid(self) -> int:
        return self.n_slices * self.tiles


def dequant_plan(raw_shape: tuple[int, ...], qtype: str, n_rows: int | None = None) -> DequantPlan:
    """The launch for raw bytes of `raw_shape` (uint8, (..., row_bytes)), gathering `n_rows` slices of
    the first axis when given; ValueError when the rows are not whole blocks."""
    qk, ts = block_geometry(qtype)
    if not raw_shape or raw_shape[-1] % ts:
        raise ValueError(
            f"{qtype} rows must be whole {ts}-byte blocks; raw data of shape {raw_shape} "
            f"has rows of {raw_shape[-1] if raw_shape else 0} bytes"
        )
    n_cols = raw_shape[-1] // ts * qk
    if n_rows is None:
        shape, n_src, n_slices = (*raw_shape[:-1], n_cols), 1, 1
    else:
        if len(raw_shape) < 2:
            raise ValueError(f"rows= picks along the first axis; raw data of shape {raw_shape} has one axis")
        shape, n_src, n_slices = (n_rows, *raw_shape[1:-1], n_cols), raw_shape[0], n_rows
    slice_values = math.prod(shape[1:]) if n_rows is not None else math.prod(shape)
    plan = DequantPlan(
        shape=shape,
        n_src=n_src,
        n_slices=n_slices,
        slice_values=slice_values,
        src_slice_bytes=math.prod(raw_shape) // max(n_src, 1),
        tiles=-(-slice_values // TILE_VALUES),
    )
    if plan.grid > 2**31 - 1:
        raise ValueError(f"{math.prod(shape)} values is too many for one launch; dequantize in parts")
    return plan


def dequant(
    raw_dev: Any,
    qtype: str,
    out: Any = None,
    dtype: str = "float32",
    rows: Any = None,
) -> Any:
    """Dequantize raw GGUF data in device memory (a CuPy array) on its GPU; returns `out`.

    raw_dev: C-contiguous uint8 (..., row_bytes) as `GGUFFile.raw()` lays it out (float16 or float32
        values are accepted for F16/F32), e.g. one layer (n_out, row_bytes) or an expert stack
        (E, n_out, row_bytes).
    qtype: a ggml type name from GPU_TYPES.
    out: a C-contiguous CuPy array of the result shape to reuse, or None to allocate one. float32 for
        dtype "float32"; for "bfloat16", 2-byte elements (uint16, as CuPy has no bfloat16 dtype)
        holding bf16 bit patterns.
    rows: None, or 1-D integer indices into the first axis of raw_dev (expert ids): only those
        slices are dequantized, in that order, so the result has len(rows) as its first axis.
        Host indices are checked here; a device array of ids is not read back (no host sync), and
        an id outside [0, E) fills its slice of `out` with NaN.
    Float32 results equal `dequant_ref` bit for bit; bfloat16 results are those rounded to nearest-even.
    Runs on the current stream of raw_dev's device, asynchronously.
    """
    _check_request(qtype, dtype)
    xp = array_module(raw_dev)
    if xp is np:
        raise TypeError(
            f"dequant runs on CuPy arrays, got {type(raw_dev).__name__}; use dequant_ref for NumPy arrays"
        )
    if out is not None and array_module(out) is np:
        raise TypeError(f"out must be a CuPy array on the raw data's device, got {type(out).__name__}")
    if out is not None and out.device.id != raw_dev.device.id:
        raise ValueError(f"out is on cuda:{out.device.id}, the raw data on cuda:{raw_dev.device.id}")
    with raw_dev.device:
        return dequant_on(cuda_runtime(), raw_dev, qtype, out, dtype, rows)


def dequant_on(
    rt: Runtime, raw_dev: Any, qtype: str, out: Any = None, dtype: str = "float32", rows: Any = None
):
    """`dequant` on a runtime (its arrays; the GPU's, or the emulator's in tests)."""
    _check_request(qtype, dtype)
    xp = rt.xp
    if raw_dev.ndim == 0:
        raise ValueError("raw_dev must have at least one axis, got a scalar")
    if not raw_dev.flags.c_contiguous:
        raise ValueError(f"raw_dev must be C-contiguous (shape {raw_dev.shape}, strides {raw_dev.strides})")
    raw_u8 = raw_dev.view(xp.uint8)
    if rows is not None and raw_u8.ndim < 2:
        raise ValueError(f"rows= picks along the first axis; raw_dev of shape {raw_dev.shape} has one axis")
    ids = None if rows is None else _device_ids(rows, raw_u8.shape[0], xp)
    plan = dequant_plan(tuple(raw_u8.shape), qtype, None if ids is None else int(ids.size))
    out = _check_out(out, plan.shape, dtype, xp)
    if plan.grid == 0:
        return out
    rt.launch(
        SOURCE, kernel_name(qtype, dtype), (plan.grid,), (THREADS,), kernel_args(plan, raw_u8, ids, out)
    )
    return out


def _check_request(qtype: str, dtype: str) -> None:
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(OUT_DTYPES)}")
    if qtype not in GPU_TYPES:
        raise ValueError(
            f"no CUDA kernel dequantizes {qtype!r}; kernels exist for {', '.join(GPU_TYPES)}; "
            "dequantize other types once on the host with dequant_ref"
        )


def kernel_args(plan: DequantPlan, src: Any, ids: Any, out: Any) -> tuple:
    """The kernel's arguments, in its parameter order and C types (pointers: arrays or None)."""
    return (
        src,
        np.int64(plan.src_slice_bytes),
        ids,
        np.int32(plan.n_src),
        np.int64(plan.slice_values),
        np.int32(plan.tiles),
        out,
    )


def _device_ids(rows: Any, n_src: int, xp: Any) -> Any:
    """rows as a contiguous int32 device vector; host rows are range-checked first."""
    if array_module(rows) is np:
        host = np.asarray(rows)
        if host.ndim != 1 or (host.size and host.dtype.kind not in "iu"):
            raise ValueError(
                f"rows must be a 1-D array of integer ids, got {host.dtype} of shape {host.shape}"
            )
        bad = host[(host < 0) | (host >= n_src)]
        if bad.size:
            raise IndexError(
                f"row id {int(bad[0])} is out of range for a stack of {n_src} (valid: 0..{n_src - 1})"
            )
        return xp.asarray(host.astype(np.int32))
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ValueError(f"rows must be a 1-D array of integer ids, got {rows.dtype} of shape {rows.shape}")
    return xp.ascontiguousarray(rows, dtype=xp.int32)


def _check_out(out: Any, shape: tuple[int, ...], dtype: str, xp: Any) -> Any:
    if out is None:
        return xp.empty(shape, dtype=xp.float32 if dtype == "float32" else xp.uint16)
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}; this call writes {shape}")
    if dtype == "float32" and out.dtype != np.float32:
        raise ValueError(f"out has dtype {out.dtype}; dtype='float32' writes float32")
    if dtype == "bfloat16" and not (out.dtype in (np.uint16, np.int16) or out.dtype.name == "bfloat16"):
        raise ValueError(
            f"out has dtype {out.dtype}; dtype='bfloat16' writes 2-byte bf16 bit patterns (uint16)"
        )
    if not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous (shape {out.shape}, strides {out.strides})")
    return out
