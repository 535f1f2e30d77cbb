"""A GGUF model in memory and its forward pass, as llama.cpp computes it.

`Model.load(path)` reads the hyperparameters (`engine.model.archs`), checks that every
tensor the architecture needs is present with the right shape, and dequantizes
the frozen weights to float32 (float16 to halve memory, float64 for tests).
`Model.forward(tokens, ...)` returns logits for every position, optionally with
a LoRA adapter applied and a KV cache extended (for generation).

Weights are NumPy arrays in GGUF's NumPy layout: a linear weight is
(n_out, n_in) and y = x @ W.T; expert stacks are (E, n_out, n_in).
Training-time caches and backward passes live elsewhere; this module is the
inference path and the definition of what the model computes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..backend import CPU, Backend, to_host
from ..errors import ModelError
from ..io.gguf_file import GGUFFile, TensorInfo, dequantizable_types
from ..io.weights import AUTO, WeightStore
from .archs import ModelConfig
from .forward import forward_hidden, logits, make_inputs, output_name
from .layers import layer_name
from .ops import LoraTerm
from .targets import split_name

log = logging.getLogger(__name__)

# Per-layer tensor kinds, by the GGUF short name (blk.N.<kind>.weight).
ATTN_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output")


def _expected_shapes(cfg: ModelConfig, i: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """NumPy shapes of the tensors layer i must have."""
    spec = cfg.spec
    C, HS = cfg.C, cfg.HS
    q_out, kv_out = cfg.NH * HS, cfg.NKV * HS
    shapes = {"attn_norm": (C,)}
    if spec.attention == "mla":
        R, n_rot = cfg.kv_lora_rank, cfg.n_rot
        if cfg.q_lora_rank:
            shapes["attn_q_a"] = (cfg.q_lora_rank, C)
            shapes["attn_q_a_norm"] = (cfg.q_lora_rank,)
            shapes["attn_q_b"] = (q_out, cfg.q_lora_rank)
        else:
            shapes["attn_q"] = (q_out, C)
        shapes["attn_kv_a_mqa"] = (R + n_rot, C)
        shapes["attn_kv_a_norm"] = (R,)
        shapes["attn_k_b"] = (cfg.NH, R, HS - n_rot)
        shapes["attn_v_b"] = (cfg.NH, cfg.head_v, R)
        shapes["attn_output"] = (C, cfg.NH * cfg.head_v)
    else:
        shapes.update({"attn_q": (q_out, C), "attn_k": (kv_out, C), "attn_v": (kv_out, C)})
        shapes["attn_output"] = (C, q_out)
    shapes[spec.ffn_norm] = (C,)
    if spec.sinks:
        shapes["attn_sinks"] = (cfg.NH,)
    if spec.post_norms:
        shapes["post_attention_norm"] = (C,)
        shapes["post_ffw_norm"] = (C,)
    if cfg.qk_norm == "head":
        shapes["attn_q_norm"] = (HS,)
        shapes["attn_k_norm"] = (HS,)
    elif cfg.qk_norm == "full":
        shapes["attn_q_norm"] = (q_out,)
        shapes["attn_k_norm"] = (kv_out,)
    if moe:
        E, Fe = cfg.E, cfg.F_exp
        shapes["ffn_gate_inp"] = (E, C)
        shapes["ffn_gate_exps"] = (E, Fe, C)
        shapes["ffn_up_exps"] = (E, Fe, C)
        shapes["ffn_down_exps"] = (E, C, Fe)
        if cfg.F_shexp:
            Fs = cfg.F_shexp
            shapes["ffn_gate_shexp"] = (Fs, C)
            shapes["ffn_up_shexp"] = (Fs, C)
            shapes["ffn_down_shexp"] = (C, Fs)
            if not spec.shared_ungated:
                shapes["ffn_gate_inp_shexp"] = (C,)
    else:
        shapes["ffn_gate"] = (cfg.F, C)
        shapes["ffn_up"] = (cfg.F, C)
        shapes["ffn_down"] = (C, cfg.F)
    return shapes


# Biases a layer may have (used when the file has them), by the shape of their weight's output.
_OPTIONAL_BIASES = ATTN_KINDS + ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def check_tensors(f: GGUFFile, cfg: ModelConfig) -> tuple[dict[str, tuple[int, ...]], tuple[bool, ...]]:
    """The tensors the graph uses with their shapes, and which layers are MoE; ModelError if any is off."""
    names = set(f.tensors)
    # the layers the directory has, before a loop over block_count that a corrupt file could make endless
    parts = (n.split(".", 2) for n in names)
    blocks = {int(p[1]) for p in parts if p[0] == "blk" and p[1:2] and p[1].isdecimal() and len(p[1]) < 10}
    n_blocks = 1 + max(blocks, default=-1)
    if cfg.L > n_blocks:
        raise ModelError(
            f"{f.path}: {cfg.arch}.block_count is {cfg.L}, but the file has tensors for "
            f"{n_blocks} layers (blk.0 .. blk.{max(n_blocks - 1, 0)}); expected at most {n_blocks}"
        )
    moe_layers = []
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.L):
        moe = layer_name(i, "ffn_gate_inp") in names
        if moe and not cfg.E:
            raise ModelError(f"{f.path}: layer {i} has a router but expert_count is not set")
        if moe and i < cfg.n_dense_lead:
            raise ModelError(
                f"{f.path}: layer {i} has a router, but {cfg.arch}.leading_dense_block_count "
                f"{cfg.n_dense_lead} makes it dense"
            )
        if cfg.E and not moe and i >= cfg.n_dense_lead:
            raise ModelError(f"{f.path}: layer {i} has no router (blk.{i}.ffn_gate_inp.weight)")
        moe_layers.append(moe)
        for kind, shape in _expected_shapes(cfg, i, moe).items():
            expected[layer_name(i, kind)] = shape
        for kind in _OPTIONAL_BIASES:
            bias = layer_name(i, kind, "bias")
            weight = expected.get(layer_name(i, kind))
            if bias in names and weight is not None:
                expected[bias] = weight[:-1]  # (n_out,), or (E, n_out) for an expert stack
        if moe and layer_name(i, "exp_probs_b", "bias") in names:
            expected[layer_name(i, "exp_probs_b", "bias")] = (cfg.E,)
    expected["token_embd.weight"] = (cfg.V, cfg.C)
    expected["output_norm.weight"] = (cfg.C,)
    if "output.weight" in names:
        expected["output.weight"] = (cfg.V, cfg.C)
    if "rope_freqs.weight" in names:
        expected["rope_freqs.weight"] = (cfg.n_rot // 2,)
    for name, shape in expected.items():
        info = f.tensors.get(name)
        if info is None:
            raise ModelError(f"{f.path}: tensor {name!r} is missing (needed by {cfg.arch})")
        if info.shape != shape:
            raise ModelError(f"{f.path}: tensor {name!r} has shape {info.shape}, expected {shape}")
        if info.qtype not in dequantizable_types():
            raise ModelError(
                f"{f.path}: tensor {name!r} has type {info.qtype}, which cannot be dequantized; "
                f"supported: {', '.join(sorted(dequantizable_types()))}"
            )
    unused = sorted(names - set(expected))
    if unused:
        log.warning("%s: %d tensors not used by the %s graph: %s", f.path, len(unused), cfg.arch, unused[:5])
    return expected, tuple(moe_layers)


def applied_lora(cfg: ModelConfig, lora: Mapping[str, LoraTerm]) -> Mapping[str, LoraTerm]:
    """The LoRA terms llama.cpp's graph of this architecture applies: adapters on the tensors it
    multiplies without build_lora_mm (ArchSpec.no_lora, deepseek2's MLA projections and output)
    load there but change nothing, so they change nothing here either."""
    skip = cfg.spec.no_lora
    if not skip or not lora:
        return lora
    return {n: t for n, t in lora.items() if split_name(n)[1] not in skip}


@dataclass
class KVCache:
    """Keys (after RoPE) and values of every layer for B sequences, grown as tokens are decoded."""

    k: list[np.ndarray]  # per layer (B, S_max, NKV, HS)
    v: list[np.ndarray]  # per layer (B, S_max, NKV, HS_v)
    pos: np.ndarray  # (B, S_max) position of each cached slot
    length: int = 0  # slots filled

    @classmethod
    def empty(cls, cfg: ModelConfig, B: int, S_max: int, dtype, xp=np) -> KVCache:
        """Keys and values in `xp`'s memory (the device of a GPU model); positions on the host."""
        shape = (B, S_max, cfg.NKV, cfg.HS)
        shape_v = (B, S_max, cfg.NKV, cfg.head_v)
        return cls(
            [xp.zeros(shape, dtype) for _ in range(cfg.L)],
            [xp.zeros(shape_v, dtype) for _ in range(cfg.L)],
            np.zeros((B, S_max), np.int64),
        )

    @property
    def capacity(self) -> int:
        return self.pos.shape[1]


@dataclass
class Model:
    """Config, the weight store of the frozen weights, and the file's tensor directory."""

    config: ModelConfig
    weights: WeightStore  # GGUF name -> array (NumPy layout), dequantized on demand
    tensors: dict[str, TensorInfo]  # GGUF name -> type, shape, bytes on disk
    metadata: dict = field(repr=False)  # the file's metadata (tokenizer, template, ...)
    path: str = ""
    moe_layers: tuple[bool, ...] = ()  # per layer: routed experts (True) or dense FFN
    backend: Backend = CPU  # where the weights live and the model computes (engine.backend)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        dtype=np.float32,
        cache_budget: str | int | None = AUTO,
        backend: Backend | None = None,
    ) -> Model:
        """Read and check a model file and open its weight store. Raises ModelError.

        dtype: what weights are dequantized to (float32; float64 for gradient checks).
        cache_budget: bytes of dequantized weights kept between uses ("auto": what is free), in
        host memory, or in device memory on a GPU backend.
        backend: a GPU backend puts the weights in device memory as the file stores them
        (engine.io.device_weights); None or the CPU keeps them memory-mapped.
        """
        backend = backend or CPU
        f = GGUFFile(path)
        cfg = ModelConfig.from_gguf(f)
        expected, moe_layers = check_tensors(f, cfg)
        if backend.is_gpu:
            from ..io.device_weights import DeviceWeights

            host = WeightStore(f, expected, np.float32, 0)
            with backend.active():
                store = DeviceWeights(host, backend.runtime, cache_budget)
        else:
            store = WeightStore(f, expected, dtype, cache_budget)
        return cls(cfg, store, dict(f.tensors), dict(f.metadata), f.path, moe_layers, backend)

    # --- facts ----------------------------------------------------------------------------------
    @property
    def dtype(self):
        dtype = getattr(self.weights, "dtype", None)  # a WeightStore; a plain dict of arrays in tests
        return dtype if dtype is not None else self.weights["token_embd.weight"].dtype

    @property
    def n_params(self) -> int:
        return int(sum(t.n_elements for t in self.tensors.values()))

    @property
    def output_name(self) -> str:
        """The output projection's tensor: output.weight, or token_embd.weight when tied."""
        return output_name(self.weights)

    def new_cache(self, B: int, S_max: int) -> KVCache:
        return KVCache.empty(self.config, B, S_max, self.dtype, self.backend.xp)

    def device_terms(self, lora: Mapping[str, LoraTerm] | None) -> dict[str, LoraTerm]:
        """LoRA terms with their factors on this model's device (as they are on the CPU)."""
        if not lora or not self.backend.is_gpu:
            return dict(lora or {})
        b = self.backend
        return {
            n: LoraTerm(b.asarray(t.A, np.float32), b.asarray(t.B, np.float32), t.s) for n, t in lora.items()
        }

    # --- forward --------------------------------------------------------------------------------
    def forward(
        self,
        tokens: np.ndarray,
        *,
        lora: Mapping[str, LoraTerm] | None = None,
        cache: KVCache | None = None,
        positions: np.ndarray | None = None,
        last_only: bool = False,
    ) -> np.ndarray:
        """Logits (B, T, V) for tokens (B, T) (or (T,) giving (T, V)).

        positions default to 0..T-1, or continue the cache. With `cache`, the new keys and
        values are appended to it. `last_only` computes the output projection for the last
        position only (generation), giving (B, 1, V).
        """
        squeeze = tokens.ndim == 1
        if squeeze:
            tokens = tokens[None]
        tokens = np.asarray(tokens, dtype=np.int64)
        B, T = tokens.shape
        cfg, W = self.config, self.weights
        lora = self.device_terms(lora)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.V):
            raise ModelError(
                f"token id out of range 0..{cfg.V - 1}: {int(tokens.min())}..{int(tokens.max())}"
            )
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = np.broadcast_to(np.arange(start, start + T, dtype=np.int64), (B, T))
        if cache is not None:
            if cache.length + T > cache.capacity:
                raise ModelError(f"KV cache full: {cache.length} + {T} tokens > {cache.capacity}")
            cache.pos[:, cache.length : cache.length + T] = positions
            k_pos = cache.pos[:, : cache.length + T]
        else:
            k_pos = positions
        lora = applied_lora(cfg, lora)
        with self.backend.active():
            inp = make_inputs(cfg, W, tokens, positions, k_pos=k_pos, dtype=self.dtype, backend=self.backend)
            h, _ = forward_hidden(cfg, W, lora, self.moe_layers, inp, kv=cache, last_only=last_only)
            if cache is not None:
                cache.length += T
            z = to_host(logits(W, lora, h, cfg.softcap))
        return z[0] if squeeze else z
