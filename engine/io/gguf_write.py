"""Writing GGUF files atomically: models, adapters, merged models.

`write_gguf` takes metadata (with explicit or inferred value types) and tensors
and writes them to a temporary file beside the target, then renames it into
place, so a failure (full disk, bad tensor, cancellation) never leaves a
half-written file or damages an existing one. A tensor is given as

- a float array, written as F32/F16 or quantized with `engine.io.quantize`;
- the bytes of an already-quantized tensor (a uint8 array of shape
  (*rows, bytes per row), as `GGUFFile.raw` returns it), written as they are;
- a `LazyTensor`, produced only when its turn comes, so that a file larger
  than memory (a merged model) is written one tensor at a time.

This module does not decide what goes in a file.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quant_shape_from_byte_shape

from ..errors import ExportError
from .files import atomic_path
from .quantize import quantizable_types, quantize


@dataclass(frozen=True)
class LazyTensor:
    """A tensor whose data is made only when it is written (one tensor in memory at a time)."""

    shape: tuple[int, ...]  # NumPy shape of the values (not of the stored bytes)
    make: Callable[[], np.ndarray]  # -> float values of `shape`, or the stored bytes (uint8) of the type


class _Writer(GGUFWriter):
    """gguf-py's writer, but an empty array is written (GGUF allows them; gguf-py raises)."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type=None) -> bytes:
        if vtype == GGUFValueType.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type or GGUFValueType.INT32) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _infer_type(key: str, value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    if isinstance(value, bool):
        return GGUFValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        if value < 0:
            return GGUFValueType.INT32, None
        return (GGUFValueType.UINT32 if value < 2**32 else GGUFValueType.UINT64), None
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32, None
    if isinstance(value, str):
        return GGUFValueType.STRING, None
    if isinstance(value, (list, tuple)):
        if not value:
            return GGUFValueType.ARRAY, GGUFValueType.INT32
        first = value[0]
        if isinstance(first, str):
            return GGUFValueType.ARRAY, GGUFValueType.STRING
        if isinstance(first, bool):
            return GGUFValueType.ARRAY, GGUFValueType.BOOL
        if isinstance(first, (float, np.floating)):
            return GGUFValueType.ARRAY, GGUFValueType.FLOAT32
        return GGUFValueType.ARRAY, GGUFValueType.INT32
    raise ExportError(f"metadata {key!r}: cannot store a value of type {type(value).__name__}")


def _ggml_type(name: str, qtype: str) -> GGMLQuantizationType:
    try:
        qt = GGMLQuantizationType[qtype]
    except KeyError:
        qt = None
    if qt is None or qt not in GGML_QUANT_SIZES:
        raise ExportError(
            f"tensor {name!r}: unknown ggml type {qtype!r}; writable: {', '.join(quantizable_types())}"
        )
    return qt


@dataclass
class _Plan:
    """One tensor as it will be written: header facts now, data on demand."""

    name: str
    qt: GGMLQuantizationType
    shape: tuple[int, ...]  # NumPy shape of the values
    n_bytes: int
    data: Any  # ndarray or LazyTensor

    def stored(self) -> np.ndarray:
        """The tensor's bytes in the file's layout: float32/float16 values, or uint8 blocks."""
        data = self.data.make() if isinstance(self.data, LazyTensor) else self.data
        data = np.asarray(data)
        qt = self.qt
        if data.dtype == np.uint8 and qt not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            out = data  # already in the type's block layout
        elif tuple(data.shape) != self.shape:
            raise ExportError(f"tensor {self.name!r}: made shape {data.shape}, announced {self.shape}")
        elif qt == GGMLQuantizationType.F32:
            out = np.ascontiguousarray(data, dtype=np.float32)
        elif qt == GGMLQuantizationType.F16:
            out = np.ascontiguousarray(data, dtype=np.float16)
        else:
            out = quantize(np.asarray(data, dtype=np.float32), qt.name)
        if out.nbytes != self.n_bytes:
            raise ExportError(
                f"tensor {self.name!r}: {out.nbytes} bytes of {qt.name} data for shape {self.shape}, "
                f"expected {self.n_bytes}"
            )
        return np.ascontiguousarray(out)


def _plan(name: str, data: Any, qtype: str) -> _Plan:
    qt = _ggml_type(name, qtype)
    block, type_size = GGML_QUANT_SIZES[qt]
    raw = (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and qt not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    )
    if isinstance(data, LazyTensor):
        shape = tuple(int(d) for d in data.shape)
    elif raw:
        if data.ndim == 0 or data.shape[-1] % type_size:
            raise ExportError(
                f"tensor {name!r}: {data.shape} bytes are not whole {qtype} blocks of {type_size} bytes"
            )
        shape = tuple(int(d) for d in quant_shape_from_byte_shape(data.shape, qt))
    else:
        data = np.asarray(data)
        shape = tuple(int(d) for d in data.shape)
        if qtype not in quantizable_types():
            raise ExportError(
                f"tensor {name!r}: cannot quantize float values to {qtype}; "
                f"supported: {', '.join(quantizable_types())} (or pass the already-quantized bytes)"
            )
    if shape and shape[-1] % block:
        raise ExportError(
            f"tensor {name!r}: {qtype} needs rows that are a multiple of {block} values, got {shape[-1]}"
        )
    return _Plan(name, qt, shape, math.prod(shape) // block * type_size, data)


def tensor_bytes(shape: tuple[int, ...], qtype: str) -> int:
    """Bytes that a tensor of NumPy `shape` takes when stored as `qtype` (rows must be whole blocks)."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return math.prod(shape) // block * type_size


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[Any, str]],
    types: Mapping[str, tuple[GGUFValueType, GGUFValueType | None]] | None = None,
    on_tensor: Callable[[int, int], None] | None = None,
) -> str:
    """Write a GGUF file atomically; returns its path.

    `tensors` maps name -> (data, ggml type name), in file order; data is a float array in NumPy
    layout, the stored bytes of a block type (uint8, as `GGUFFile.raw` gives them), or a
    `LazyTensor`. `general.architecture` is set from `arch`; `types` may give the exact value type
    of keys (as read by `GGUFFile.metadata_types`); other keys get a type inferred from the value.
    `general.alignment`, when present, sets the data alignment. `on_tensor(done, total)` is called
    after each tensor is written; an `ExportError` it raises stops the write (nothing is changed).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError(f"{path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a folder; give a file name ending in .gguf")
    types = types or {}
    plans = [_plan(name, data, qtype) for name, (data, qtype) in tensors.items()]
    w: GGUFWriter | None = None
    try:
        with atomic_path(path, suffix=".gguf") as tmp:
            try:
                w = _Writer(tmp, arch)
                for key, value in metadata.items():
                    if key == "general.architecture":
                        continue
                    vtype, sub = types.get(key) or _infer_type(key, value)
                    if vtype == GGUFValueType.ARRAY:
                        w.add_key_value(key, list(value), vtype, sub_type=sub)
                    else:
                        w.add_key_value(key, value, vtype)
                if "general.alignment" in metadata:
                    w.data_alignment = int(metadata["general.alignment"])
                for p in plans:
                    w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), p.n_bytes, raw_dtype=p.qt)
                w.write_header_to_file()
                w.write_kv_data_to_file()
                w.write_ti_data_to_file()
                for i, p in enumerate(plans):
                    w.write_tensor_data(p.stored())
                    if on_tensor is not None:
                        on_tensor(i + 1, len(plans))
                w.flush()
            finally:
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()
    except BaseException as exc:  # KeyboardInterrupt too: atomic_path never leaves the temporary file
        if isinstance(exc, ExportError) or not isinstance(exc, Exception):
            raise
        # OSError (disk full, no room for the temporary file), ValueError from gguf-py
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise ExportError(f"{path}: could not be written ({why}); no file was changed") from exc
    return path
