"""What a model file holds, without loading its weights: the facts `tune-engine inspect` and the
studio's Model page show (architecture, sizes, tensor kinds with types and bytes, tokenizer,
chat template). It validates the file as `Model.load` would, so a summary that succeeds means
the model will load; it does not dequantize anything.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass

from ..io.gguf_file import GGUFFile
from .archs import ModelConfig
from .model import check_tensors


@dataclass(frozen=True)
class TensorKind:
    """All tensors of one kind (blk.N.<kind>.weight over the layers, or a global tensor)."""

    kind: str  # e.g. "attn_q.weight", "ffn_up_exps.weight", "token_embd.weight"
    count: int  # how many tensors (layers)
    types: dict[str, int]  # ggml type -> count
    shape: tuple[int, ...]  # NumPy shape of one tensor
    n_params: int  # elements, all tensors of the kind
    n_bytes: int  # bytes on disk, all tensors of the kind


@dataclass(frozen=True)
class ModelSummary:
    path: str
    file_bytes: int
    config: ModelConfig
    n_params: int
    n_tensors: int
    kinds: tuple[TensorKind, ...]
    file_type: str  # the dominant matmul weight type, e.g. "Q4_K"
    tokenizer_model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokenizer_pre: str  # tokenizer.ggml.pre
    vocab_size: int
    has_chat_template: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = asdict(self.config)
        d["moe"] = self.config.is_moe
        return d


_LAYER = re.compile(r"^blk\.\d+\.")


def summarize(path: str | os.PathLike[str]) -> ModelSummary:
    """Read a model's header and directory; ModelError if the file would not load."""
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    check_tensors(f, cfg)
    groups: dict[str, list] = {}
    for info in f.tensors.values():
        groups.setdefault(_LAYER.sub("", info.name), []).append(info)
    kinds = []
    for kind, infos in groups.items():
        kinds.append(
            TensorKind(
                kind=kind,
                count=len(infos),
                types=dict(Counter(i.qtype for i in infos)),
                shape=infos[0].shape,
                n_params=sum(i.n_elements for i in infos),
                n_bytes=sum(i.n_bytes for i in infos),
            )
        )
    matmul_types = Counter()
    for info in f.tensors.values():
        if len(info.shape) >= 2:
            matmul_types[info.qtype] += info.n_elements
    tokens = f.get("tokenizer.ggml.tokens") or []
    return ModelSummary(
        path=f.path,
        file_bytes=os.path.getsize(f.path),
        config=cfg,
        n_params=sum(i.n_elements for i in f.tensors.values()),
        n_tensors=len(f.tensors),
        kinds=tuple(kinds),
        file_type=matmul_types.most_common(1)[0][0] if matmul_types else "F32",
        tokenizer_model=str(f.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(f.get("tokenizer.ggml.pre", "")),
        vocab_size=len(tokens) or cfg.V,
        has_chat_template=bool(f.get("tokenizer.chat_template")),
    )


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int, exact: bool = False) -> str:
    """77824 -> '77.82 K' (exact: '77,824 (77.82 K)')."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            short = f"{n / div:.2f} {unit}"
            return f"{n:,} ({short})" if exact else short
    return str(n)
