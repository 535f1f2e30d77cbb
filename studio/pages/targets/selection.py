"""The LoRA target selection behind the Targets page, as plain Python that the grid and the tree observe.

`TargetSelection` knows every tensor of the open model (engine `lora_candidates`), lays them out as
layers × tensor kinds, holds which ones are selected, and tells its listeners when that changes.
`TargetSelection.stats` turns a selection into the figures the page shows (trainable parameters,
adapter size, memory estimate) from tensor shapes alone: no weights are loaded.

Not Qt and not the project: the page keeps this selection and `project.config.targets` in step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from engine import (
    PRESETS,
    Candidate,
    MemoryEstimate,
    ModelConfig,
    ModelError,
    TargetSpec,
    TensorInfo,
    TrainConfig,
    estimate_memory,
    lora_candidates,
    lora_param_count,
    parse_layers,
    select_full,
    select_targets,
)

# Column order of the grid: the per-layer LoRA kinds in the order of PRESETS["all"], then any other
# per-layer matrix kinds, then global matrices (token_embd, output), then vectors that cannot take LoRA.
LAYER_KIND_ORDER: tuple[str, ...] = PRESETS["all"]
GLOBAL_KIND_ORDER: tuple[str, ...] = ("token_embd", "output")

KIND_HELP: dict[str, str] = {
    "attn_q": "attention query projection",
    "attn_k": "attention key projection",
    "attn_v": "attention value projection",
    "attn_output": "attention output projection",
    "attn_qkv": "fused query/key/value projection",
    "ffn_gate": "MLP gate projection (SwiGLU)",
    "ffn_up": "MLP up projection",
    "ffn_down": "MLP down projection",
    "ffn_gate_shexp": "shared expert gate projection",
    "ffn_up_shexp": "shared expert up projection",
    "ffn_down_shexp": "shared expert down projection",
    "ffn_gate_exps": "routed experts' gate projections (3-D stack)",
    "ffn_up_exps": "routed experts' up projections (3-D stack)",
    "ffn_down_exps": "routed experts' down projections (3-D stack)",
    "ffn_gate_inp": "router: the expert gating logits",
    "ffn_gate_inp_shexp": "shared expert gate vector",
    "token_embd": "token embedding table",
    "output": "output projection (LM head)",
    "attn_norm": "RMSNorm before attention",
    "ffn_norm": "RMSNorm before the MLP",
    "output_norm": "final RMSNorm",
    "attn_q_norm": "query norm",
    "attn_k_norm": "key norm",
    "rope_freqs": "RoPE frequency factors",
}

# Kinds offered in the "Train in full" list when the model has them (besides every vector kind).
FULL_MATRIX_KINDS: tuple[str, ...] = ("ffn_gate_inp",)

F32_BYTES = 4
GGUF_ALIGN = 32


def kind_help(kind: str) -> str:
    if kind.endswith(".bias"):
        return f"bias of {kind[: -len('.bias')]}"
    return KIND_HELP.get(kind, kind)


def kind_group(kind: str, lora: bool, is_global: bool) -> str:
    """Colour group of a grid column: attention, mlp, shared, experts, router, other, global, vector."""
    if not lora:
        return "vector"
    if is_global:
        return "global"
    if kind in PRESETS["attention"]:
        return "attention"
    if kind in PRESETS["experts"]:
        return "experts"
    if kind.endswith("_shexp"):
        return "shared"
    if kind in PRESETS["mlp"]:
        return "mlp"
    if kind in PRESETS["router"]:
        return "router"
    return "other"


def is_expert(c: Candidate) -> bool:
    """A 3-D expert stack: one LoRA pair per expert."""
    return c.lora_ok and len(c.shape) == 3


def shape_text(shape: tuple[int, ...]) -> str:
    return " × ".join(str(d) for d in shape)


def ab_shapes(c: Candidate, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NumPy shapes of the A and B factors (for display; engine.model.lora is the authority)."""
    if c.name == "token_embd.weight":
        V, C = c.shape
        return (V, rank), (C, rank)
    if len(c.shape) == 3:
        E, n_out, n_in = c.shape
        return (E, rank, n_in), (E, n_out, rank)
    n_out, n_in = c.shape
    return (rank, n_in), (n_out, rank)


def adapter_file_bytes(tensors: Mapping[str, TensorInfo], names: Iterable[str], rank: int) -> int:
    """Approximate size of an F32 adapter GGUF: header, metadata, tensor directory, aligned data."""
    header = 24 + 256  # magic, version, counts; general.type, adapter.type, adapter.lora.alpha, arch
    data = 0
    for name in names:
        for suffix, n in zip(
            (".lora_a", ".lora_b"), _pair_sizes(tensors[name].shape, name, rank), strict=True
        ):
            header += 8 + len(name) + len(suffix) + 4 + 8 * len(tensors[name].shape) + 4 + 8
            size = n * F32_BYTES
            data += size + (-size) % GGUF_ALIGN
    header += (-header) % GGUF_ALIGN
    return header + data


def _pair_sizes(shape: tuple[int, ...], name: str, rank: int) -> tuple[int, int]:
    c = Candidate(name, "", None, shape, "F32", True, "")
    a, b = ab_shapes(c, rank)
    return math.prod(a), math.prod(b)


@dataclass(frozen=True)
class Column:
    """One kind of tensor: a column of the grid."""

    kind: str  # "attn_q", "ffn_up_exps", "token_embd", "attn_norm", ...
    group: str  # colour group, see kind_group
    lora: bool  # its tensors can take LoRA
    is_global: bool  # a global tensor (outside the blocks)


@dataclass(frozen=True)
class SelectionStats:
    """What a selection costs, from shapes alone."""

    n_tensors: int  # tensors with a LoRA adapter
    n_expert_tensors: int  # of which 3-D expert stacks
    lora_params: int  # A and B elements, all adapters
    expert_params: int  # of which on expert stacks
    full_tensors: int  # tensors trained in full
    full_params: int  # their elements
    trainable: int  # lora_params + full_params
    adapter_bytes: int  # ≈ size of the F32 adapter file
    model_params: int  # parameters of the model
    memory: MemoryEstimate  # engine.estimate_memory of the selection
    full_error: str = ""  # why config.full does not resolve, if it does not

    @property
    def share(self) -> float:
        """Trainable parameters as a fraction of the model's."""
        return self.trainable / self.model_params if self.model_params else 0.0


Listener = Callable[[str, set[str]], None]


class TargetSelection:
    """Which tensors of one model get LoRA adapters. Listeners hear (origin, changed): origin "user"
    for an edit of cells or tree items, "spec" when a whole selection was put in place from a
    TargetSpec; changed, the names whose state flipped (views repaint only those)."""

    def __init__(self, tensors: Mapping[str, TensorInfo], n_layers: int):
        self.tensors = dict(tensors)
        self.n_layers = n_layers
        self.candidates: list[Candidate] = lora_candidates(self.tensors)
        self.by_name: dict[str, Candidate] = {c.name: c for c in self.candidates}
        self._order = {c.name: i for i, c in enumerate(self.candidates)}
        self._cells: dict[tuple[int | None, str], Candidate] = {(c.layer, c.kind): c for c in self.candidates}
        self.columns: list[Column] = self._layout_columns()
        self.layers: list[int] = sorted({c.layer for c in self.candidates if c.layer is not None})
        has_globals = any(c.layer is None for c in self.candidates)
        self.rows: list[int | None] = list(self.layers) + ([None] if has_globals else [])
        self.selected: set[str] = set()
        self._listeners: list[Listener] = []
        self._param_cache: dict[tuple[str, int], int] = {}

    def _layout_columns(self) -> list[Column]:
        layer_kinds: dict[str, bool] = {}
        global_kinds: dict[str, bool] = {}
        for c in self.candidates:
            kinds = global_kinds if c.layer is None else layer_kinds
            kinds[c.kind] = kinds.get(c.kind, False) or c.lora_ok

        def ordered(kinds: dict[str, bool], first: tuple[str, ...]) -> list[str]:
            return [k for k in first if k in kinds] + [k for k in kinds if k not in first]

        layer = ordered(layer_kinds, LAYER_KIND_ORDER)
        glob = ordered(global_kinds, GLOBAL_KIND_ORDER)
        cols = [Column(k, kind_group(k, True, False), True, False) for k in layer if layer_kinds[k]]
        cols += [Column(k, kind_group(k, True, True), True, True) for k in glob if global_kinds[k]]
        cols += [Column(k, "vector", False, False) for k in layer if not layer_kinds[k]]
        cols += [Column(k, "vector", False, True) for k in glob if not global_kinds[k]]
        return cols

    # --- observing --------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _notify(self, origin: str, changed: set[str]) -> None:
        for listener in list(self._listeners):
            listener(origin, changed)

    # --- looking ----------------------------------------------------------------------------
    def cell(self, layer: int | None, kind: str) -> Candidate | None:
        return self._cells.get((layer, kind))

    def names(self) -> list[str]:
        """Selected tensor names in file order."""
        return sorted(self.selected, key=self._order.__getitem__)

    def kind_names(self, kind: str) -> list[str]:
        """LoRA-capable tensors of one kind (a grid column)."""
        return [c.name for c in self.candidates if c.kind == kind and c.lora_ok]

    def layer_names(self, layer: int | None) -> list[str]:
        """LoRA-capable tensors of one layer, or the global ones for None (a grid row)."""
        return [c.name for c in self.candidates if c.layer == layer and c.lora_ok]

    def has_preset(self, preset: str) -> bool:
        """Whether the preset selects anything in this model ("none" always can be applied)."""
        kinds = set(PRESETS.get(preset, ()))
        return preset == "none" or any(c.lora_ok and c.kind in kinds for c in self.candidates)

    def resolve(self, spec: TargetSpec) -> list[str]:
        """Names a spec selects here (engine select_targets); an empty "none" spec selects nothing.
        ModelError when the spec does not fit this model."""
        if spec.preset == "none" and not spec.patterns:
            parse_layers(spec.layers, self.n_layers)  # still validate the range
            return []
        return select_targets(self.tensors, spec, self.n_layers)

    # --- changing ---------------------------------------------------------------------------
    def set_checked(self, names: Iterable[str], on: bool, origin: str = "user") -> bool:
        """Select (on) or deselect names that can take LoRA; True and listeners told if anything changed."""
        names = {n for n in names if n in self.by_name and self.by_name[n].lora_ok}
        new = self.selected | names if on else self.selected - names
        if new == self.selected:
            return False
        changed = new ^ self.selected
        self.selected = new
        self._notify(origin, changed)
        return True

    def replace(self, names: Iterable[str], origin: str = "spec") -> None:
        """Put a whole selection in place (listeners are told even when it is the same)."""
        new = {n for n in names if n in self.by_name and self.by_name[n].lora_ok}
        changed = new ^ self.selected
        self.selected = new
        self._notify(origin, changed)

    def toggle(self, names: list[str]) -> bool:
        """Deselect the names if all are selected, else select them all (a header click)."""
        if not names:
            return False
        return self.set_checked(names, not all(n in self.selected for n in names))

    def toggle_kind(self, kind: str) -> bool:
        return self.toggle(self.kind_names(kind))

    def toggle_layer(self, layer: int | None) -> bool:
        return self.toggle(self.layer_names(layer))

    # --- costs ------------------------------------------------------------------------------
    def lora_params(self, name: str, rank: int) -> int:
        """LoRA parameters of one tensor at a rank (engine lora_param_count, remembered)."""
        key = (name, rank)
        if key not in self._param_cache:
            self._param_cache[key] = lora_param_count(self.tensors, [name], rank)
        return self._param_cache[key]

    def full_kinds(self) -> list[str]:
        """Kinds that make sense to train in full: every vector kind (norms, biases, gates) and the router."""
        kinds: dict[str, None] = {}
        for c in self.candidates:
            if (not c.lora_ok and c.kind != "rope_freqs") or c.kind in FULL_MATRIX_KINDS:
                kinds[c.kind] = None
        return list(kinds)

    def stats(
        self,
        config: TrainConfig,
        model_config: ModelConfig,
        model_params: int,
        names: list[str] | None = None,
    ) -> SelectionStats:
        """Figures for a selection (the current one by default) at config.rank, with config.full."""
        names = self.names() if names is None else names
        rank = config.rank
        experts = [n for n in names if is_expert(self.by_name[n])]
        lora = lora_param_count(self.tensors, names, rank)
        expert_params = lora_param_count(self.tensors, experts, rank)
        full_error = ""
        try:
            full = select_full(self.tensors, tuple(config.full), self.n_layers) if config.full else []
        except ModelError as exc:
            full, full_error = [], str(exc)
        full_params = sum(self.tensors[n].n_elements for n in full)
        trainable = lora + full_params
        return SelectionStats(
            n_tensors=len(names),
            n_expert_tensors=len(experts),
            lora_params=lora,
            expert_params=expert_params,
            full_tensors=len(full),
            full_params=full_params,
            trainable=trainable,
            adapter_bytes=adapter_file_bytes(self.tensors, names, rank) if names else 0,
            model_params=model_params,
            memory=estimate_memory(model_config, self.tensors, trainable, config, lora_targets=names),
            full_error=full_error,
        )
