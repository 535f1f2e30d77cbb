"""Routing census: how many of a dataset's tokens the BASE model's router sends to each expert of each
MoE layer, before any training.

`routing_census(model, data, template, options)` prepares the dataset exactly as training does
(engine.train.prepared, from its cache when nothing that shaped it changed), then runs the model's
own forward pass (engine.model.forward.forward_hidden, no adapter, no output head) over every kept
sample and adds up the routing each MoE block did (engine.model.layers.expert_counts: the block's
own top-k choice, DeepSeek's group limits and selection bias included; no second copy of the
routing math here).

What is counted: token-choices. A token routed to its top K experts counts once for each of them,
so every MoE layer's row sums to K x the tokens. EVERY token of every kept sample counts, prompt
tokens too, whether or not the loss is taken on it: the router sees all of them, and an expert's
LoRA factors get a gradient from every token routed to it (the loss at a later token reaches an
earlier one through attention). Padding never counts: samples are packed into windows of whole
samples with no padding, kept apart by their segment ids, so a sample routes as it would alone.
"Tokens the data sends to each expert", in the studio's words.

Memory stays bounded: at most `window` tokens (or one sample, when it is longer) go through the
model at once. `on_progress` hears how far it is; `cancelled()` returning True stops it between
windows (CensusCancelled).

The result is cached in `census` under the user data folder (engine.io.files.user_data_folder), one
.npz per (model file identity: path, size and modification time; what shaped the prepared data:
dataset SHA-256, template, tokenizer, settings, encoder code; the routing code), written by
temporary name and rename, and used again only when its stored key matches and every layer's
row sums to K x its token count; anything else is counted again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..backend import to_host
from ..errors import DatasetError, ModelError
from ..io.files import atomic_write, user_data_folder
from ..model.forward import forward_hidden, make_inputs
from .encode import EncodeOptions
from .prepared import KEPT, PreparedData, default_cache_folder, prepare_data

if TYPE_CHECKING:
    from ..model.model import Model
    from ..text.chat_template import ChatTemplate

log = logging.getLogger(__name__)

FORMAT = "tune-studio routing census 1"
WINDOW = 512  # tokens through the model at once (a longer sample goes alone)
MAX_ENTRIES = 32  # census files kept (least recently used removed first)


class CensusCancelled(Exception):
    """The census was stopped by its `cancelled` callback; nothing was cached."""


@dataclass(frozen=True)
class CensusProgress:
    """How far a census is: phase "preparing" (the dataset, engine.train.prepared) or "routing"."""

    phase: str
    done: int  # bytes of the dataset ("preparing") or tokens routed ("routing")
    total: int


@dataclass(frozen=True)
class Census:
    """Token-choices the data sends to each expert of each MoE layer (see the module docstring)."""

    counts: np.ndarray  # (n_moe_layers, E) int64
    layers: tuple[int, ...]  # the model's layer index of each row
    n_tokens: int  # tokens routed (every kept sample's, prompt included)
    n_samples: int  # samples they came from
    K: int  # experts chosen per token: every row sums to K * n_tokens
    reused: bool = field(default=False, compare=False)  # read from the cache

    @property
    def n_experts(self) -> int:
        return int(self.counts.shape[1])

    def unreached(self) -> list[tuple[int, int]]:
        """(layer, expert) of every expert no token is routed to, in layer order."""
        return [(self.layers[r], int(e)) for r, e in zip(*np.nonzero(self.counts == 0), strict=True)]

    def unreached_mask(self) -> np.ndarray:
        """(n_moe_layers, E) True where the expert receives no token."""
        return self.counts == 0

    def shares(self) -> np.ndarray:
        """(n_moe_layers, E) each expert's share of its layer's token-choices (rows sum to 1)."""
        total = self.counts.sum(axis=1, keepdims=True)
        return self.counts / np.maximum(total, 1)

    def to_json(self) -> dict:
        return {
            "layers": list(self.layers),
            "n_experts": self.n_experts,
            "K": self.K,
            "n_tokens": self.n_tokens,
            "n_samples": self.n_samples,
            "counts": self.counts.tolist(),
            "unreached": [list(u) for u in self.unreached()],
        }


def census_folder() -> str:
    """Where census results are cached: `census` in the app's data folder."""
    return os.path.join(user_data_folder(), "census")


def _code_fingerprint() -> str:
    """SHA-256 of the code that routes tokens: a changed routing never reuses an older census."""
    from ..kernels import moe, moe_cuda
    from ..model import forward, layers

    h = hashlib.sha256(FORMAT.encode())
    for module in (moe, moe_cuda, forward, layers):
        try:
            h.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            h.update(module.__name__.encode())
    return h.hexdigest()


def model_identity(path: str) -> dict:
    """What identifies a model file without reading it all: its real path, size and modification time."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def census_key(model_path: str, shaped_by: dict) -> str:
    """The cache key of a census of the model file at `model_path` over data shaped by `shaped_by`."""
    blob = json.dumps(
        {"model": model_identity(model_path), "data": shaped_by, "code": _code_fingerprint()},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_cached(path: str, key: str) -> Census | None:
    """The census cached at `path` when it is intact and has this key; None otherwise."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            counts = np.asarray(z["counts"])
            layers = tuple(int(i) for i in z["layers"])
            n_tokens, n_samples, K = (int(z[k]) for k in ("n_tokens", "n_samples", "K"))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        log.info("census cache %s unusable (%s): counted again", path, exc)
        return None
    if counts.dtype != np.int64 or counts.ndim != 2 or counts.shape[0] != len(layers):
        return None
    if (counts < 0).any() or not (counts.sum(axis=1) == K * n_tokens).all():
        log.info("census cache %s does not add up: counted again", path)
        return None
    os.utime(path)  # recently used
    return Census(counts, layers, n_tokens, n_samples, K, reused=True)


def _write_cached(folder: str, key: str, c: Census) -> None:
    os.makedirs(folder, exist_ok=True)
    with atomic_write(os.path.join(folder, key + ".npz"), "wb") as f:
        np.savez(
            f, key=np.array(key), counts=c.counts, layers=np.array(c.layers, np.int64),
            n_tokens=np.int64(c.n_tokens), n_samples=np.int64(c.n_samples), K=np.int64(c.K),
        )  # fmt: skip
    entries = sorted(Path(folder).glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[MAX_ENTRIES:]:
        old.unlink(missing_ok=True)


def moe_layer_indices(model: Model) -> tuple[int, ...]:
    """The model's MoE layers; ModelError for a dense model (no routing to count)."""
    layers = tuple(i for i, m in enumerate(model.moe_layers) if m)
    if not layers:
        name = os.path.basename(model.path) or "the model"
        raise ModelError(f"{name} has no MoE layer: no routing to count")
    return layers


def _windows(data: PreparedData, rows: np.ndarray, window: int):
    """Groups of rows whose tokens add up to at most `window` (a longer sample alone), in order."""
    lengths = data.samples["length"][rows].astype(np.int64)
    group: list[int] = []
    size = 0
    for r, n in zip(rows.tolist(), lengths.tolist(), strict=True):
        if group and size + n > window:
            yield group
            group, size = [], 0
        group.append(r)
        size += n
    if group:
        yield group


def count_routing(
    model: Model,
    data: PreparedData,
    *,
    window: int = WINDOW,
    on_progress: Callable[[CensusProgress], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Census:
    """The census of `data` (every kept sample) through `model` with no adapter; not cached."""
    cfg = model.config
    layers = tuple(i for i, m in enumerate(model.moe_layers) if m)
    if not layers:
        raise ModelError(
            f"{os.path.basename(model.path) or 'the model'} has no MoE layer: no routing to count"
        )
    kept = np.flatnonzero(data.samples["flags"] & KEPT)
    total = int(data.samples["length"][kept].sum())
    counts = np.zeros((len(layers), cfg.E), np.int64)
    done = 0
    report = on_progress or (lambda p: None)
    report(CensusProgress("routing", 0, total))
    for group in _windows(data, kept, window):
        if cancelled is not None and cancelled():
            raise CensusCancelled("the routing census was cancelled")
        encoded = [data.encoded(r) for r in group]
        tokens = np.concatenate([e.tokens for e in encoded])[None, :]
        positions = np.concatenate([np.arange(len(e.tokens)) for e in encoded])[None, :]
        segments = np.concatenate([np.full(len(e.tokens), k) for k, e in enumerate(encoded)])[None, :]
        with model.backend.active():
            inp = make_inputs(
                cfg, model.weights, tokens, positions, segments, dtype=model.dtype, backend=model.backend
            )
            usage: list = []
            forward_hidden(cfg, model.weights, {}, model.moe_layers, inp, expert_usage=usage)
            counts += np.stack([to_host(usage[i]) for i in layers]).astype(np.int64)
        done += tokens.shape[1]
        report(CensusProgress("routing", done, total))
    return Census(counts, layers, total, len(kept), int(cfg.K))


def routing_census(
    model: Model | str,
    data: str | os.PathLike[str],
    template: ChatTemplate | str | None = None,
    options: EncodeOptions | None = None,
    *,
    pairs: bool = False,
    cache: str | os.PathLike[str] | None = "auto",
    data_cache: str | os.PathLike[str] | None = "auto",
    window: int = WINDOW,
    on_progress: Callable[[CensusProgress], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Census:
    """The routing census of the JSON Lines dataset `data` through the base model (see the module
    docstring): from the cache when the model file, the prepared data and the routing code are
    unchanged, counted (and cached) otherwise.

    model: a loaded Model or a model file's path. template: a ChatTemplate, a template file, or
    None (the model's own). options: how samples become tokens (default: training's, n_ctx 512).
    pairs: prepared as a preference objective's pairs (DPO, ORPO). cache / data_cache: the folders
    of census results / prepared datasets ("auto": under the app's data folder; None: none).
    """
    from ..model.model import Model
    from ..text.chat_template import ChatTemplate, template_for
    from ..text.tokenizer import Tokenizer

    if not isinstance(model, Model):
        model = Model.load(model)
    if not any(model.moe_layers):
        raise ModelError(
            f"{os.path.basename(model.path) or 'the model'} has no MoE layer: no routing to count"
        )
    report = on_progress or (lambda p: None)
    md = model.metadata
    tok = Tokenizer.from_metadata(md, model.path)
    tmpl = template if isinstance(template, ChatTemplate) else template_for(md, template)
    options = options or EncodeOptions(n_ctx=512)
    data_cache = default_cache_folder() if data_cache == "auto" else data_cache
    prepared = prepare_data(
        data, tok, tmpl, options, cache=data_cache, pairs=pairs,
        on_progress=lambda p: report(CensusProgress("preparing", p.done, p.total)),
    )  # fmt: skip
    try:
        return census_of(
            model, prepared, cache=cache, window=window, on_progress=on_progress, cancelled=cancelled
        )
    finally:
        prepared.close()


def census_of(
    model: Model,
    prepared: PreparedData,
    *,
    cache: str | os.PathLike[str] | None = "auto",
    window: int = WINDOW,
    on_progress: Callable[[CensusProgress], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Census:
    """The census of already prepared data: from the cache folder (None: no cache; "auto": the app's)
    when an entry of the same model file, prepared data and routing code is intact, counted (and
    cached) otherwise. Data prepared in memory (no dataset file) is never cached."""
    moe_layer_indices(model)
    if not (prepared.samples["flags"] & KEPT).any():
        raise DatasetError("the dataset has no usable sample: no routing to count")
    folder = census_folder() if cache == "auto" else (os.fspath(cache) if cache is not None else None)
    if prepared.dataset_sha256 is None:
        folder = None
    key = census_key(model.path, prepared.meta["shaped_by"]) if folder is not None else ""
    if folder is not None:
        found = _read_cached(os.path.join(folder, key + ".npz"), key)
        if found is not None:
            return found
    result = count_routing(model, prepared, window=window, on_progress=on_progress, cancelled=cancelled)
    if folder is not None:
        try:
            _write_cached(folder, key, result)
        except OSError as exc:  # the census stands; it is counted again next time
            log.warning("the routing census could not be cached in %s: %s", folder, exc)
    return result


def unreached_factors(census: Census, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """For each routed-expert LoRA target (a 3-D `*_exps` tensor of shape (E, n_out, n_in)) of a layer
    the census counted: the experts no token reaches (int64 indices; targets with none are left out).
    `shapes`: the targets' base tensor shapes, by name (2-D targets are skipped)."""
    from ..model.targets import split_name

    rows = {layer: row for row, layer in enumerate(census.layers)}
    out = {}
    for name, shape in shapes.items():
        layer, _kind = split_name(name)
        if len(shape) != 3 or layer not in rows or shape[0] != census.n_experts:
            continue
        experts = np.flatnonzero(census.counts[rows[layer]] == 0)
        if len(experts):
            out[name] = experts
    return out


@dataclass(frozen=True)
class LeftOut:
    """What leaving out the unreached experts' factors saves on a selection of LoRA targets."""

    frozen: dict[str, np.ndarray]  # expert target -> the experts no token reaches
    n_sets: int  # (expert target, expert) factor pairs never reached
    n_total_sets: int  # (expert target, expert) factor pairs of the layers the census counted
    params: int  # LoRA parameters in the unreached pairs: A (r, n_in) and B (n_out, r) each

    def describe(self) -> str:
        """'N of M expert factor sets are never reached by this data: X parameters that would never learn'."""
        if not self.n_total_sets:
            return "no routed-expert factors are selected"
        if not self.n_sets:
            return f"every one of the {self.n_total_sets} expert factor sets receives tokens of this data"
        return (
            f"{self.n_sets} of {self.n_total_sets} expert factor sets are never reached by this data: "
            f"{self.params:,} parameters that would never learn"
        )


def left_out(census: Census, shapes: Mapping[str, tuple[int, ...]], rank: int) -> LeftOut:
    """The unreached experts' LoRA factor pairs among targets of these base shapes, at this rank."""
    frozen = unreached_factors(census, shapes)
    rows = set(census.layers)
    from ..model.targets import split_name

    total = sum(
        shape[0]
        for name, shape in shapes.items()
        if len(shape) == 3 and split_name(name)[0] in rows and shape[0] == census.n_experts
    )
    params = sum(len(e) * rank * (shapes[n][1] + shapes[n][2]) for n, e in frozen.items())
    return LeftOut(frozen, sum(len(e) for e in frozen.values()), total, params)
