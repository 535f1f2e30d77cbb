"""Exporting a LoRA adapter: as an adapter GGUF that llama.cpp loads, or merged into its base model.

`export_adapter` writes what `llama-cli --lora` / `llama_adapter_lora_init` reads
(src/llama-adapter.cpp): `general.type = "adapter"`, `general.architecture` = the
base model's, `adapter.type = "lora"`, `adapter.lora.alpha` (FLOAT32), and for
each adapted base tensor `<name>.lora_a` / `<name>.lora_b` in the layouts of
`engine.model.lora`. The loader puts no constraint on the tensor types; ggml's matmul
and get_rows need rows that are whole blocks. So:

- F32 (default) and F16 are written as asked.
- Q8_0 is written for every tensor whose rows (the last NumPy dimension) are a
  multiple of 32; the others, typically every `lora_b` whose rank is not a
  multiple of 32 (and both factors of `token_embd`, whose rows are r long), are
  written as F16, as llama.cpp's converters do when `gguf.quants` raises
  QuantError (convert_hf_to_gguf.py, on which convert_lora_to_gguf.py builds).
  `adapter_tensor_types` says in advance which tensor gets which type, and the
  export logs it. Note that `llama-export-lora`
  refuses quantized adapters ("please retry with f16 or f32"): a Q8_0 adapter
  is for `--lora` at run time only.

Training facts go in `training.*` keys, typed from their Python values (see
`training_metadata`).

`export_merged` writes a whole model with W + s·ΔW folded in, s = scale·alpha/r:

- every metadata key is copied with its exact value type (tokenizer and chat
  template included);
- every tensor that is not adapted is copied byte for byte in its stored type;
- an adapted tensor is dequantized and merged in float32, then written in a type
  that keeps the update (`qtype` None, the default): F16 where the base stores it
  quantized (a Q4 or Q8 step is larger than most LoRA updates: re-quantizing
  W + s·ΔW to the base's type gives back W and throws the fine-tune away), its
  own type where the base stores it as F32, F16 or BF16 (BF16 becomes F16: its
  8-bit mantissa drops small updates too). This is what `llama-export-lora`
  does for quantized tensors ("output model is F16"), but only for the adapted
  tensors: the others keep their own type, so a Q4_1 file with LoRA on
  attention grows by the F16 size of its attention matrices, not to a whole
  F16 model. Re-quantizing is an explicit choice: `qtype` "base" (each adapted
  tensor back to its own stored type) or a type name (every adapted matrix in
  that type), F16 where its rows are not whole blocks of that type; what
  survives is measured after writing (`engine.export.verify`). Every change of
  type is listed in `MergeReport.type_changes`;
- `replace_tensors` (weights trained in full) stand in for base tensors the
  same way, vectors keeping their own type;
- `general.file_type` is kept when no tensor changed type and dropped when one
  did (llama.cpp then derives the file type from the most common tensor type
  and marks it "guessed"; a stale "mostly Q8_0" would be wrong). Nothing else
  in the metadata changes. (`llama-export-lora` instead writes every merged
  tensor as F16 or F32 and sets file_type to MOSTLY_F16.)

Tensors are produced and written one at a time, so memory holds one tensor
and its merge, never the model. Every file goes to a temporary name first
(`engine.io.gguf_write`): a failed or cancelled export leaves the target as it
was. This module writes files; it does not train, load models or evaluate.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import ExportError, ModelError
from ..io.gguf_file import GGUFFile, dequantizable_types
from ..io.gguf_write import LazyTensor, tensor_bytes, write_gguf
from ..io.quantize import quantizable_types
from ..model.lora import SUFFIX_A, SUFFIX_B, LoraAdapter, effective_scale, lora_shapes

log = logging.getLogger(__name__)

ADAPTER_TYPES = ("F32", "F16", "Q8_0")  # types export_adapter writes
MERGE_BASE_TYPE = "base"  # merge qtype: each adapted tensor re-quantized to the base's own type
FLOAT_TYPES = ("F32", "F16")  # types an adapted tensor keeps by default (merged without rounding it away)
TOOL = "tune-studio"  # training.tool
_ALIGN = 32  # GGUF's default data alignment, for size estimates
# Keys of a loaded adapter's metadata that export_adapter sets itself, or that describe the old file.
_ADAPTER_OWN_KEYS = frozenset(
    {
        "general.architecture",
        "general.type",
        "adapter.type",
        "adapter.lora.alpha",
        "general.alignment",
        "general.file_type",
    }
)


# --- adapter ---------------------------------------------------------------------------------------


def _check_pairs(adapter: LoraAdapter) -> None:
    """ExportError unless every pair has one of the three layouts with one rank, and finite values."""
    if not adapter.pairs:
        raise ExportError("the adapter has no tensors; nothing to export")
    for name, (A, B) in adapter.pairs.items():
        A, B = np.asarray(A), np.asarray(B)
        if name == "token_embd.weight":
            ok = A.ndim == 2 and B.ndim == 2 and A.shape[1] == B.shape[1]
            want = "A (V, r) and B (C, r)"
        elif A.ndim == 2:
            ok = B.ndim == 2 and A.shape[0] == B.shape[1]
            want = "A (r, n_in) and B (n_out, r)"
        else:
            ok = A.ndim == 3 and B.ndim == 3 and A.shape[0] == B.shape[0] and A.shape[1] == B.shape[2]
            want = "A (E, r, n_in) and B (E, n_out, r)"
        if not ok:
            raise ExportError(f"{name}: lora_a {A.shape} and lora_b {B.shape} do not fit; expected {want}")
        for label, x in (("lora_a", A), ("lora_b", B)):
            if not np.all(np.isfinite(x)):
                raise ExportError(f"{name}.{label.removeprefix('lora_')}: contains NaN or infinity")


def _rows_fit(shape: tuple[int, ...], qtype: str) -> bool:
    return not shape or shape[-1] % GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0] == 0


def adapter_tensor_types(adapter: LoraAdapter, qtype: str = "F32") -> dict[str, str]:
    """The type each adapter tensor (`<base>.lora_a` / `.lora_b`) is written as for a requested type.

    Q8_0 needs rows of a multiple of 32 values; other tensors get F16 (see the module docstring).
    """
    if qtype not in ADAPTER_TYPES:
        raise ExportError(
            f"adapter type {qtype!r} is not supported; choose one of {', '.join(ADAPTER_TYPES)}"
        )
    out = {}
    for name, (A, B) in adapter.pairs.items():
        for suffix, x in ((SUFFIX_A, A), (SUFFIX_B, B)):
            out[name + suffix] = qtype if _rows_fit(np.shape(x), qtype) else "F16"
    return out


def _value_type(key: str, value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    """GGUF type of one training value: bool, int (UINT32/UINT64, INT32/INT64 when negative),
    float as FLOAT64 (exact), str, or a homogeneous list of those."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if v >= 0:
            return (GGUFValueType.UINT32 if v < 2**32 else GGUFValueType.UINT64), None
        return (GGUFValueType.INT32 if v >= -(2**31) else GGUFValueType.INT64), None
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT64, None
    if isinstance(value, str):
        return GGUFValueType.STRING, None
    if isinstance(value, (list, tuple)):
        if not value:
            return GGUFValueType.ARRAY, GGUFValueType.STRING
        items = {_value_type(key, v)[0] for v in value}
        if GGUFValueType.ARRAY in items:
            raise ExportError(f"{key}: nested lists cannot be stored")
        if items <= {GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.INT32, GGUFValueType.INT64}:
            lo, hi = min(int(v) for v in value), max(int(v) for v in value)
            if lo >= 0:
                return GGUFValueType.ARRAY, (GGUFValueType.UINT32 if hi < 2**32 else GGUFValueType.UINT64)
            small = lo >= -(2**31) and hi < 2**31
            return GGUFValueType.ARRAY, (GGUFValueType.INT32 if small else GGUFValueType.INT64)
        if items <= {GGUFValueType.FLOAT64, GGUFValueType.UINT32, GGUFValueType.INT32}:
            return GGUFValueType.ARRAY, GGUFValueType.FLOAT64
        if len(items) == 1:
            return GGUFValueType.ARRAY, items.pop()
        raise ExportError(f"{key}: a list must hold values of one kind, got {sorted(t.name for t in items)}")
    raise ExportError(
        f"{key}: cannot store a {type(value).__name__} in GGUF metadata "
        "(use bool, int, float, str, a list of one of them, or a mapping of those)"
    )


def _plain(value: Any) -> Any:
    """Paths become strings, NumPy scalars and arrays become Python values and lists."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def training_metadata(
    training: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, tuple[GGUFValueType, GGUFValueType | None]]]:
    """`training` as `training.*` keys with their GGUF types: (values, types).

    Keys get the `training.` prefix unless they have it; nested mappings become dotted keys
    (`{"optimizer": {"lr": 1e-4}}` -> `training.optimizer.lr`); None values are left out;
    `training.tool` defaults to "tune-studio". Floats are FLOAT64 so that they read back exactly,
    ints UINT32 (UINT64 or INT32/INT64 where needed), lists ARRAY of their item type (an empty
    list is an ARRAY of STRING). Anything else is an ExportError naming the key.
    """
    values: dict[str, Any] = {}

    def walk(prefix: str, m: Mapping[str, Any]) -> None:
        for k, v in m.items():
            key = f"{prefix}.{k}"
            if isinstance(v, Mapping):
                walk(key, v)
            elif v is not None:
                values[key] = _plain(v)

    for k, v in training.items():
        key = k if str(k).startswith("training.") else f"training.{k}"
        if isinstance(v, Mapping):
            walk(key, v)
        elif v is not None:
            values[key] = _plain(v)
    values.setdefault("training.tool", TOOL)
    types = {k: _value_type(k, v) for k, v in values.items()}
    return values, types


def _carried_metadata(
    adapter: LoraAdapter,
) -> tuple[dict[str, Any], dict[str, tuple[GGUFValueType, GGUFValueType | None]]]:
    """A loaded adapter's own keys (name, training facts...), exactly typed when its file is at hand."""
    md = {k: v for k, v in adapter.metadata.items() if k not in _ADAPTER_OWN_KEYS}
    types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    if md and adapter.path and os.path.isfile(adapter.path):
        with contextlib.suppress(ModelError):
            src = GGUFFile(adapter.path)
            types = {k: src.metadata_types[k] for k in md if k in src.metadata and src.metadata[k] == md[k]}
            src.close()
    for k, v in md.items():
        if k not in types:
            types[k] = _value_type(k, v)
    return md, types


def export_adapter(
    adapter: LoraAdapter,
    path: str | os.PathLike[str],
    *,
    qtype: str = "F32",
    training: Mapping[str, Any] | None = None,
) -> str:
    """Write `adapter` as a llama.cpp LoRA GGUF (F32, F16 or Q8_0); returns the path.

    Keys of `adapter.metadata` (for an adapter read from a file: its name and training facts) are
    kept, except those this function sets and the old file's alignment and file type; `training`
    adds or replaces `training.*` keys. ExportError for a bad type, an adapter without
    architecture or with inconsistent shapes or non-finite values, or a target that cannot be written.
    """
    types_by_tensor = adapter_tensor_types(adapter, qtype)
    if not adapter.arch:
        raise ExportError(
            "the adapter has no architecture (general.architecture of its base model); llama.cpp needs it"
        )
    _check_pairs(adapter)
    alpha = float(adapter.alpha)
    if not math.isfinite(alpha):
        raise ExportError(f"adapter.lora.alpha must be a finite number, got {alpha}")
    md, types = _carried_metadata(adapter)
    md.update({"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": alpha})
    types["general.type"] = (GGUFValueType.STRING, None)
    types["adapter.type"] = (GGUFValueType.STRING, None)
    types["adapter.lora.alpha"] = (GGUFValueType.FLOAT32, None)
    if training:
        t_values, t_types = training_metadata(training)
        md.update(t_values)
        types.update(t_types)
    tensors: dict[str, tuple[Any, str]] = {}
    for name, (A, B) in adapter.pairs.items():
        tensors[name + SUFFIX_A] = (np.asarray(A, np.float32), types_by_tensor[name + SUFFIX_A])
        tensors[name + SUFFIX_B] = (np.asarray(B, np.float32), types_by_tensor[name + SUFFIX_B])
    fallback = sorted(n for n, t in types_by_tensor.items() if t != qtype)
    if fallback:
        log.warning(
            "%s: %d tensors have rows that are not a multiple of 32 and are written as F16, not %s: %s",
            os.fspath(path),
            len(fallback),
            qtype,
            ", ".join(fallback),
        )
    _check_target(path)
    return write_gguf(path, adapter.arch, md, tensors, types)


# --- checks ----------------------------------------------------------------------------------------


def fit_problems(adapter: LoraAdapter, base: GGUFFile, *, check_arch: bool = True) -> list[str]:
    """Why `adapter` cannot be applied to the model in `base` (empty when it can).

    Architecture (unless check_arch is False), presence of every adapted tensor, A/B shapes for the
    base shape, and a base type that can be dequantized; read from the file's directory, without
    loading weights. Every problem is listed, not only the first.
    """
    problems = []
    arch = base.get("general.architecture")
    if check_arch and adapter.arch and adapter.arch != arch:
        problems.append(
            f"the adapter is for architecture {adapter.arch!r}, the model {base.path} is {arch!r}"
        )
    for name, (A, B) in adapter.pairs.items():
        info = base.tensors.get(name)
        if info is None:
            problems.append(f"adapted tensor {name!r} does not exist in {base.path}")
            continue
        r = np.shape(B)[-1]
        try:
            want_a, want_b = lora_shapes(name, info.shape, r)
        except ModelError as exc:
            problems.append(str(exc))
            continue
        if np.shape(A) != want_a or np.shape(B) != want_b:
            problems.append(
                f"{name}: lora_a {np.shape(A)} and lora_b {np.shape(B)} do not fit the base shape "
                f"{info.shape} (rank {r} needs {want_a} and {want_b})"
            )
        if info.qtype not in dequantizable_types():
            problems.append(f"{name}: the base stores it as {info.qtype}, which cannot be dequantized")
    return problems


def _check_target(path: str | os.PathLike[str], avoid: str | None = None) -> str:
    """The target's folder: ExportError unless it exists, is writable, and the target is not a folder
    (or the file `avoid`)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError(f"{path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ExportError(f"{path}: folder {folder} is not writable")
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a folder; give a file name ending in .gguf")
    if avoid is not None and os.path.exists(path) and os.path.samefile(path, avoid):
        raise ExportError(f"{path}: is the base model itself; write the merged model to another file")
    return folder


# --- merged model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeReport:
    """What export_merged wrote."""

    path: str  # the merged model file
    base: str  # the base model it was made from
    merged: tuple[str, ...]  # base tensors with the adapter folded in, in file order
    replaced: tuple[str, ...] = ()  # base tensors whose values were replaced (replace_tensors)
    type_changes: dict[str, tuple[str, str]] = field(default_factory=dict)  # tensor -> (base type, written)
    scale: float = 1.0  # adapter scale used (s = scale * alpha / r)
    n_tensors: int = 0  # tensors in the file
    n_bytes: int = 0  # size of the file
    file_type: int | None = None  # general.file_type written; None when dropped or absent in the base
    file_type_dropped: bool = False  # the base had one, but tensors changed type


def _merge_type(name: str, shape: tuple[int, ...], stored: str, qtype: str | None) -> str:
    if len(shape) < 2:  # a vector (norm, bias) keeps its type: ggml's elementwise ops want F32 there
        want = stored
    elif qtype is None:  # keep the update: float types stay, quantized ones become F16
        want = stored if stored in FLOAT_TYPES else "F16"
    elif qtype == MERGE_BASE_TYPE:
        want = stored
    else:
        want = qtype
    if want not in quantizable_types():
        return "F16"
    return want if _rows_fit(shape, want) else "F16"


def check_merge_type(qtype: str | None) -> None:
    """ExportError unless `qtype` is a merge type: None (keep the update), "base", or a writable type."""
    if qtype is not None and qtype != MERGE_BASE_TYPE and qtype not in quantizable_types():
        raise ExportError(
            f"cannot write merged tensors as {qtype!r}; choose one of {', '.join(quantizable_types())}, "
            f"or {MERGE_BASE_TYPE!r} (each adapted tensor re-quantized to the base model's own type)"
        )


def merged_tensor_types(adapter: LoraAdapter, base: GGUFFile, qtype: str | None = None) -> dict[str, str]:
    """The type each adapted base tensor is written as by `export_merged` (see the module docstring):
    by default F16 for a quantized base tensor and its own type for a float one; with `qtype` "base"
    its stored type; else `qtype`. F16 where that type cannot be written or its rows are not whole
    blocks."""
    return {
        name: _merge_type(name, base.tensors[name].shape, base.tensors[name].qtype, qtype)
        for name in adapter.pairs
        if name in base.tensors
    }


def export_size(adapter: LoraAdapter, *, qtype: str | None = "F32", base: GGUFFile | None = None) -> int:
    """About how many bytes the written file takes: the adapter alone (`qtype` F32/F16/Q8_0), or, with
    `base`, the merged model (`qtype` as `export_merged` takes it)."""
    if base is None:
        types = adapter_tensor_types(adapter, qtype or "F32")
        size = 4096 + sum(96 + len(n) for n in types)
        for name, (A, B) in adapter.pairs.items():
            size += _padded(tensor_bytes(np.shape(A), types[name + SUFFIX_A]))
            size += _padded(tensor_bytes(np.shape(B), types[name + SUFFIX_B]))
        return size
    size = os.path.getsize(base.path)
    for name, written in merged_tensor_types(adapter, base, qtype).items():
        info = base.tensors[name]
        size += _padded(tensor_bytes(info.shape, written)) - _padded(info.n_bytes)
    return size


F16_MAX = 65504.0  # the largest finite float16


def _merged_tensor(
    f: GGUFFile,
    name: str,
    pair: tuple[np.ndarray, np.ndarray] | None,
    s: float,
    w_new: np.ndarray | None,
    out_type: str = "F32",
) -> Callable[[], np.ndarray]:
    """W (from the file, or its replacement) + s·ΔW, made when the writer gets to it; ExportError when
    it is written as F16 and a value lies beyond F16's range (it would become infinite)."""

    def make() -> np.ndarray:
        # (n_out, n_in), (E, n_out, n_in), token_embd (V, C), or a vector (replacements only)
        w = f.load(name, np.float32) if w_new is None else np.array(w_new, dtype=np.float32)
        if pair is not None:
            A, B = pair
            if name == "token_embd.weight":
                delta = np.asarray(A) @ np.asarray(B).T  # (V, r) @ (r, C)
            else:
                delta = np.matmul(np.asarray(B), np.asarray(A))  # (..., n_out, r) @ (..., r, n_in)
            w += (s * delta).astype(np.float32)
        if out_type == "F16":
            peak = float(np.max(np.abs(w))) if w.size else 0.0
            if not peak <= F16_MAX:
                raise ExportError(
                    f"{name}: the merged values reach {peak:.4g}, beyond F16's range ({F16_MAX:g}); "
                    "export the merged model with type F32"
                )
        return w

    return make


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def export_merged(
    base_path: str | os.PathLike[str],
    adapter: LoraAdapter,
    path: str | os.PathLike[str],
    *,
    scale: float = 1.0,
    qtype: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    replace_tensors: Mapping[str, np.ndarray] | None = None,
) -> MergeReport:
    """Write the base model with the adapter merged in (W + scale·alpha/r·ΔW); see the module docstring.

    Checks before anything is written: `qtype` (None: adapted tensors in a type that keeps the
    update; "base": re-quantized to their own type; or a type for every adapted matrix), the
    base file, architecture, adapted tensors and shapes, the target folder and free disk space;
    each failure is an ExportError naming the problem. `on_progress(done, total)` is called after
    each tensor; `should_stop()` returning True between tensors cancels (ExportError, nothing written).
    `replace_tensors` (name -> float array of the base tensor's shape, e.g. weights trained in full)
    stand in for the base's values before the adapter is added; they are written like adapted
    tensors (their own type, or `qtype` for matrices) and listed in `MergeReport.replaced`.
    """
    check_merge_type(qtype)
    if not math.isfinite(scale):
        raise ExportError(f"scale must be a finite number, got {scale}")
    try:
        f = GGUFFile(base_path)
    except ModelError as exc:
        raise ExportError(f"cannot merge into the base model: {exc}") from exc
    if f.get("general.type") == "adapter":
        raise ExportError(f"{f.path}: is an adapter, not a base model")
    arch = f.get("general.architecture")
    if not arch:
        raise ExportError(f"{f.path}: has no general.architecture; not a model llama.cpp can load")
    problems = fit_problems(adapter, f)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ExportError(f"the adapter does not fit the base model: {problems[0]}{more}")
    for name, (A, B) in adapter.pairs.items():
        if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
            raise ExportError(f"{name}: the adapter's lora_a or lora_b contains NaN or infinity")
    replace = dict(replace_tensors or {})
    for name, w in replace.items():
        info = f.tensors.get(name)
        if info is None:
            raise ExportError(f"replacement tensor {name!r} does not exist in {f.path}")
        if np.shape(w) != info.shape:
            raise ExportError(f"replacement for {name}: shape {np.shape(w)}, the base has {info.shape}")
        if not np.all(np.isfinite(w)):
            raise ExportError(f"replacement for {name}: contains NaN or infinity")
    folder = _check_target(path, avoid=f.path)

    tensors: dict[str, tuple[Any, str]] = {}
    changes: dict[str, tuple[str, str]] = {}
    merged = []
    size = os.path.getsize(f.path)
    for name, info in f.tensors.items():
        pair = adapter.pairs.get(name)
        if pair is not None or name in replace:
            s = effective_scale(adapter.alpha, int(np.shape(pair[1])[-1]), scale) if pair else 0.0
            out = _merge_type(name, info.shape, info.qtype, qtype)
            if out != info.qtype:
                changes[name] = (info.qtype, out)
            make = _merged_tensor(f, name, pair, s, replace.get(name), out)
            tensors[name] = (LazyTensor(info.shape, make), out)
            if pair is not None:
                merged.append(name)
            size += _padded(tensor_bytes(info.shape, out)) - _padded(info.n_bytes)
        else:
            tensors[name] = (f.raw(name), info.qtype)
    metadata = dict(f.metadata)
    types = dict(f.metadata_types)
    file_type = metadata.get("general.file_type")
    dropped = bool(changes) and file_type is not None
    if dropped:
        del metadata["general.file_type"]
        del types["general.file_type"]
        file_type = None
    free = shutil.disk_usage(folder).free
    if free < size:
        raise ExportError(
            f"{os.fspath(path)}: not enough disk space in {folder}: the merged model needs about "
            f"{size / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free"
        )

    def progress(done: int, total: int) -> None:
        if on_progress is not None:
            on_progress(done, total)
        if should_stop is not None and done < total and should_stop():
            raise ExportError(f"{os.fspath(path)}: export cancelled; no file was changed")

    if changes:
        log.info("%s: tensors written in another type: %s", os.fspath(path), changes)
    n_tensors = len(tensors)
    f_names = list(tensors)
    try:
        out_path = write_gguf(path, str(arch), metadata, tensors, types, on_tensor=progress)
    finally:
        tensors.clear()  # drop the views of the memory-mapped base before closing it
        f.close()
    return MergeReport(
        path=out_path,
        base=os.fspath(base_path),
        merged=tuple(merged),
        replaced=tuple(n for n in f_names if n in replace),
        type_changes=changes,
        scale=float(scale),
        n_tensors=n_tensors,
        n_bytes=os.path.getsize(out_path),
        file_type=None if file_type is None else int(file_type),
        file_type_dropped=dropped,
    )
