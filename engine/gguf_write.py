"""Writing GGUF files atomically: models, adapters, merged models.

`write_gguf` takes metadata (with explicit or inferred value types) and tensors
(float arrays, written as F32/F16/BF16 or quantized with `engine.quantize`),
writes them to a temporary file beside the target and renames it into place,
so a failure (full disk, bad tensor) never leaves a half-written file or
damages an existing one. This module does not decide what goes in a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from .errors import ExportError
from .quantize import quantize


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


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[np.ndarray, str]],
    types: Mapping[str, tuple[GGUFValueType, GGUFValueType | None]] | None = None,
) -> str:
    """Write a GGUF file atomically. `tensors` maps name -> (float array in NumPy layout, ggml type name).

    `general.architecture` is set from `arch`; `types` may give the exact value type of keys
    (as read by `GGUFFile.metadata_types`); other keys get a type inferred from the value.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError(f"{path}: folder {folder} does not exist")
    types = types or {}
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=folder)
    os.close(fd)
    try:
        w = GGUFWriter(tmp, arch)
        for key, value in metadata.items():
            if key == "general.architecture":
                continue
            vtype, sub = types.get(key) or _infer_type(key, value)
            if vtype == GGUFValueType.ARRAY:
                w.add_key_value(key, list(value), vtype, sub_type=sub)
            else:
                w.add_key_value(key, value, vtype)
        for name, (array, qtype) in tensors.items():
            qt = GGMLQuantizationType[qtype]
            if qt == GGMLQuantizationType.F32:
                w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
            elif qt == GGMLQuantizationType.F16:
                w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))
            else:
                w.add_tensor(name, quantize(np.asarray(array, dtype=np.float32), qtype), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except ExportError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    except Exception as exc:  # noqa: BLE001 - OSError (disk full), ValueError from gguf-py
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ExportError(
            f"{path}: could not be written ({type(exc).__name__}: {exc}); no file was changed"
        ) from exc
    return path
