"""LoRA adapters in llama.cpp's GGUF layout: reading and checking against a model.

An adapter file has `general.type = "adapter"`, `adapter.type = "lora"`,
`adapter.lora.alpha` (float32) and, for each adapted base tensor `<name>`, the
tensors `<name>.lora_a` and `<name>.lora_b`. NumPy shapes:

- 2-D weight W (n_out, n_in): A (r, n_in), B (n_out, r); y = x W^T + s (x A^T) B^T
- expert stack (E, n_out, n_in): A (E, r, n_in), B (E, n_out, r), per expert
- token_embd (V, C): A (V, r), B (C, r); x = W[t] + s A[t] B^T (llama.cpp's get_rows layout)

with s = scale * alpha / r (llama.cpp drops alpha / r when alpha is 0).
This module reads and validates; training and writing adapters live elsewhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelError
from ..io.gguf_file import GGUFFile
from .ops import LoraTerm

SUFFIX_A = ".lora_a"
SUFFIX_B = ".lora_b"


def lora_shapes(
    base_name: str, base_shape: tuple[int, ...], r: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NumPy shapes of A and B for a rank-r adapter on a base tensor; ModelError if it cannot take one."""
    if base_name == "token_embd.weight" and len(base_shape) == 2:
        V, C = base_shape
        return (V, r), (C, r)
    if len(base_shape) == 2:
        n_out, n_in = base_shape
        return (r, n_in), (n_out, r)
    if len(base_shape) == 3:
        E, n_out, n_in = base_shape
        return (E, r, n_in), (E, n_out, r)
    raise ModelError(
        f"{base_name}: a tensor of shape {base_shape} cannot take a LoRA adapter (needs 2-D or 3-D)"
    )


def effective_scale(alpha: float, r: int, scale: float = 1.0) -> float:
    """s in y += s (x A^T) B^T: scale * alpha / r, or scale alone when alpha is 0 (as llama.cpp)."""
    return scale * (alpha / r if alpha else 1.0)


def _check_finite(path: str, name: str, values: np.ndarray) -> None:
    """ModelError naming the tensor when `values` hold a NaN or an infinity: such an adapter would
    turn every logit it touches into NaN."""
    bad = ~np.isfinite(values)
    if bad.any():
        n_nan = int(np.isnan(values).sum())
        raise ModelError(
            f"{path}: tensor {name!r} holds {int(bad.sum())} non-finite values ({n_nan} NaN, "
            f"{int(bad.sum()) - n_nan} infinite) of {values.size}: the adapter is broken (a run that "
            "diverged, or a corrupt file) and cannot be used"
        )


@dataclass
class LoraAdapter:
    """A set of LoRA factor pairs keyed by base tensor name, with one alpha."""

    alpha: float  # adapter.lora.alpha
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]  # base name -> (A, B)
    arch: str = ""  # general.architecture of the base model
    metadata: dict = field(default_factory=dict, repr=False)
    path: str = ""

    def rank(self, name: str) -> int:
        A, B = self.pairs[name]
        return int(B.shape[-1])

    def terms(self, scale: float = 1.0) -> dict[str, LoraTerm]:
        """The factor pairs with their effective scale, as the forward pass takes them."""
        return {
            n: LoraTerm(A, B, effective_scale(self.alpha, self.rank(n), scale))
            for n, (A, B) in self.pairs.items()
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str], model=None, dtype=None) -> LoraAdapter:
        """Read an adapter file; with `model`, check architecture, names and shapes against it."""
        f = GGUFFile(path)
        if f.get("general.type") != "adapter" or f.get("adapter.type") != "lora":
            raise ModelError(
                f"{f.path}: not a LoRA adapter (general.type = {f.get('general.type')!r}, "
                f"adapter.type = {f.get('adapter.type')!r}; expected 'adapter' and 'lora')"
            )
        alpha = f.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ModelError(f"{f.path}: adapter.lora.alpha is {alpha!r}; expected a finite number")
        alpha = float(alpha)
        dtype = dtype or (model.dtype if model is not None else np.float32)
        bases = {}
        for name in f.tensors:
            for suffix in (SUFFIX_A, SUFFIX_B):
                if name.endswith(suffix):
                    bases.setdefault(name[: -len(suffix)], set()).add(suffix)
                    break
            else:
                raise ModelError(f"{f.path}: tensor {name!r} is not a .lora_a or .lora_b tensor")
        pairs = {}
        for base, have in sorted(bases.items()):
            if have != {SUFFIX_A, SUFFIX_B}:
                missing = ({SUFFIX_A, SUFFIX_B} - have).pop()
                raise ModelError(
                    f"{f.path}: {base}{missing} is missing (each adapted tensor needs lora_a and lora_b)"
                )
            A = f.load(base + SUFFIX_A, dtype)
            B = f.load(base + SUFFIX_B, dtype)
            for suffix, values in ((SUFFIX_A, A), (SUFFIX_B, B)):
                _check_finite(f.path, base + suffix, values)
            pairs[base] = (A, B)
        adapter = cls(alpha, pairs, str(f.get("general.architecture", "")), dict(f.metadata), f.path)
        if model is not None:
            adapter.check(model)
        return adapter

    def check(self, model) -> None:
        """ModelError unless every pair fits a tensor of `model` (architecture, name, shapes)."""
        where = self.path or "adapter"
        if self.arch and self.arch != model.config.arch:
            raise ModelError(
                f"{where}: adapter is for architecture {self.arch!r}, model is {model.config.arch!r}"
            )
        for base, (A, B) in self.pairs.items():
            info = model.tensors.get(base)
            if info is None:
                raise ModelError(f"{where}: adapted tensor {base!r} does not exist in the model")
            r = B.shape[-1]
            want_a, want_b = lora_shapes(base, info.shape, r)
            if A.shape != want_a or B.shape != want_b:
                raise ModelError(
                    f"{where}: {base} has lora_a {A.shape} and lora_b {B.shape}; for base shape {info.shape} "
                    f"and rank {r} expected {want_a} and {want_b} (A and B transposed?)"
                )
