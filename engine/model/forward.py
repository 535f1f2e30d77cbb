"""The model-level forward and backward: embedding, blocks, final norm and output head, written once.

Inference (`Model.forward`, generation with a KV cache), training (`engine.train.train_model`)
and the KL reference model all run through `forward_hidden`; `backward_hidden` is its exact
reverse. The rules that belong to the whole model live here and nowhere else:

- positions, RoPE angles and the attention mask come from one builder (`make_inputs`), with
  packed samples kept apart by their segment ids;
- the output head is `output.weight`, or `token_embd.weight` when the model ties them; a LoRA on
  a tied embedding also acts on the logits (llama.cpp applies the token_embd adapter there too);
- weights are looked up in `W` (the weight store, overlaid with tensors trained in full) when
  they are used, so no layer's weights are held between its forward and its backward.

Shapes: tokens (B, T), hidden states (B, T, C), logits (B, T, V).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from typing import NamedTuple

import numpy as np

from ..backend import array_module, to_host
from . import ops
from .archs import ModelConfig
from .layers import BlockCache, add_grad, add_lora_grads, block_backward, block_forward, expert_counts
from .ops import LoraTerm
from .rope_scaling import yarn_angles

TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"
OUTPUT_NORM = "output_norm.weight"


class Inputs(NamedTuple):
    """What every block needs besides the hidden states."""

    tokens: np.ndarray  # (B, T) token ids
    positions: np.ndarray  # (B, T) position of each token (restarting per packed sample)
    mask: np.ndarray  # (B, T, S) query t may attend key s
    cos: np.ndarray  # (B, T, n_rot/2) RoPE angles
    sin: np.ndarray
    mask_swa: np.ndarray | None = None  # (B, T, S) the sliding-window layers' mask (models with them)
    cos_swa: np.ndarray | None = None  # the sliding-window layers' RoPE angles (their own base)
    sin_swa: np.ndarray | None = None

    def layer(self, cfg: ModelConfig, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cos, sin, mask) of layer i."""
        if cfg.swa_layers and cfg.swa_layers[i]:
            return self.cos_swa, self.sin_swa, self.mask_swa
        return self.cos, self.sin, self.mask


def _rope_tables(cfg: ModelConfig, positions, base: float, scaled: bool, freqs, dtype):
    if cfg.rope_scaling == "yarn" and scaled:
        return yarn_angles(
            positions, cfg.n_rot, base, cfg.rope_scale, cfg.rope_orig_ctx, cfg.yarn_beta_fast,
            cfg.yarn_beta_slow, cfg.rope_mscale, freqs, dtype,
        )  # fmt: skip
    return ops.rope_angles(positions, cfg.n_rot, base, cfg.rope_scale if scaled else 1.0, freqs, dtype)


def make_inputs(
    cfg: ModelConfig,
    W: Mapping[str, np.ndarray],
    tokens: np.ndarray,
    positions: np.ndarray,
    segments: np.ndarray | None = None,
    k_pos: np.ndarray | None = None,
    dtype=np.float32,
    backend=None,
) -> Inputs:
    """RoPE angles and the causal mask for tokens at `positions` (keys at `k_pos`, default the same),
    built on the host and put on `backend`'s device (an engine.backend.Backend; None: the host)."""
    tokens = np.asarray(to_host(tokens), dtype=np.int64)
    positions = np.asarray(to_host(positions), dtype=np.int64)
    if segments is not None:
        segments = np.asarray(to_host(segments), dtype=np.int64)
    k_pos = positions if k_pos is None else np.asarray(to_host(k_pos), dtype=np.int64)
    mask = ops.attention_mask(positions, k_pos, segments, segments if segments is not None else None)
    freqs = W.get("rope_freqs.weight")
    freqs = None if freqs is None else to_host(freqs)
    if cfg.rope_scaling == "yarn":
        cos, sin = _rope_tables(cfg, positions, cfg.rope_base, True, freqs, dtype)
    else:
        cos, sin = ops.rope_angles(positions, cfg.n_rot, cfg.rope_base, cfg.rope_scale, freqs, dtype)
    inp = Inputs(tokens, positions, mask, cos, sin)
    if cfg.has_swa:
        # llama.cpp masks key s for query t when t - s >= sliding_window (positions, so a KV cache too)
        mask_swa = mask & (positions[:, :, None] - k_pos[:, None, :] < cfg.swa_window)
        scaled = cfg.spec.swa_rope_scaled
        if cfg.rope_base_swa == cfg.rope_base and (scaled or cfg.rope_scaling == "none"):
            cos_swa, sin_swa = cos, sin
        else:
            cos_swa, sin_swa = _rope_tables(cfg, positions, cfg.rope_base_swa, scaled, freqs, dtype)
        inp = inp._replace(mask_swa=mask_swa, cos_swa=cos_swa, sin_swa=sin_swa)
    if backend is not None and backend.is_gpu:
        inp = Inputs(*(None if a is None else backend.asarray(a) for a in inp))
    return inp


def prefetch_layer(W: Mapping[str, np.ndarray], i: int) -> None:
    """Let the weight store start reading layer i's stored bytes ahead of use (a store that keeps
    only part of the model dequantized reads the rest from the file each pass; see
    engine.io.weights.WeightStore.prefetch_layer). W may overlay the store (a ChainMap)."""
    store = W.maps[-1] if isinstance(W, ChainMap) else W
    fn = getattr(store, "prefetch_layer", None)
    if fn is not None:
        fn(i)


def output_name(W: Mapping[str, np.ndarray]) -> str:
    """The output projection's tensor: output.weight, or token_embd.weight when tied."""
    return OUTPUT if OUTPUT in W else TOKEN_EMBD


class ForwardCache(NamedTuple):
    """What `backward_hidden` needs from `forward_hidden`."""

    emb: ops.EmbeddingCache
    blocks: list  # per block: its BlockCache, or its input x (B, T, C) when checkpointing
    final_norm: ops.NormCache
    checkpoint: bool  # blocks hold inputs to recompute from
    aux_coef: float = 0.0  # the MoE load-balancing loss's weight (recomputed blocks keep its gradient)


def forward_hidden(
    cfg: ModelConfig,
    W: Mapping[str, np.ndarray],
    lora: Mapping[str, LoraTerm],
    moe_layers: tuple[bool, ...],
    inp: Inputs,
    *,
    kv=None,
    keep: str = "none",
    last_only: bool = False,
    expert_usage: list | None = None,
    aux_coef: float = 0.0,
    aux_values: list | None = None,
) -> tuple[np.ndarray, ForwardCache | None]:
    """Final normalised hidden states (B, T, C) (or (B, 1, C) with `last_only`).

    keep: "none" (inference), "caches" (every block's activations for the backward pass) or
    "inputs" (only each block's input: the backward recomputes the block, layer checkpointing).
    With `kv` (a KVCache) each block appends its keys and values. `expert_usage`, when given,
    receives the tokens routed to each expert of every MoE block, (E,) per block. `aux_coef`: the
    weight of each MoE block's load-balancing loss (engine.model.layers.load_balance), whose value per
    block goes to `aux_values` and whose gradient `backward_hidden` adds to the router's.
    """
    x, c_emb = ops.embedding_forward(W[TOKEN_EMBD], inp.tokens, lora.get(TOKEN_EMBD))
    if cfg.embd_scale != 1.0:
        x = x * x.dtype.type(cfg.embd_scale)  # gemma3: sqrtf(n_embd), a float32 product in llama.cpp
    kept = []
    for i in range(cfg.L):
        x_in = x
        if i + 1 < cfg.L:
            prefetch_layer(W, i + 1)
        cos, sin, mask = inp.layer(cfg, i)
        x, cache = block_forward(cfg, W, lora, i, moe_layers[i], x, cos, sin, mask, kv=kv, aux_coef=aux_coef)
        if aux_values is not None and cache.moe is not None and cache.moe.aux is not None:
            aux_values.append(cache.moe.aux[0])
        if expert_usage is not None:
            n = expert_counts(cache)
            if n is None and cfg.E:  # a dense layer of a MoE model (DeepSeek's first): a row of zeros
                n = array_module(x).zeros(cfg.E, np.int64)
            if n is not None:
                expert_usage.append(n)
        if keep == "caches":
            kept.append(cache)
        elif keep == "inputs":
            kept.append(x_in)
        del cache
    if last_only:
        x = x[:, -1:]
    h, c_fn = ops.rmsnorm_forward(x, W[OUTPUT_NORM], cfg.rms_eps)
    if keep == "none":
        return h, None
    return h, ForwardCache(c_emb, kept, c_fn, keep == "inputs", aux_coef)


def logits(
    W: Mapping[str, np.ndarray], lora: Mapping[str, LoraTerm], h: np.ndarray, softcap: float = 0.0
) -> np.ndarray:
    """The output head on hidden states (..., C): (..., V), with its LoRA (and the tied one), and the
    final soft-cap cap * tanh(z / cap) when the model has one (`softcap`, ModelConfig.softcap)."""
    name = output_name(W)
    z = ops.project(h, W[name])
    out_lora = lora.get(OUTPUT) if name == OUTPUT else None
    if out_lora is not None:
        z += out_lora.s * ((h @ out_lora.A.T) @ out_lora.B.T)
    emb = lora.get(TOKEN_EMBD)
    if emb is not None and name == TOKEN_EMBD:
        # tied output: the embedding adapter W + s A B^T (V, C) also acts on logits = h W^T
        z += emb.s * ((h @ emb.B) @ emb.A.T)
    if softcap:
        z, _ = ops.softcap_forward(z, softcap)
    return z


def backward_hidden(
    cfg: ModelConfig,
    W: Mapping[str, np.ndarray],
    lora: Mapping[str, LoraTerm],
    moe_layers: tuple[bool, ...],
    inp: Inputs,
    dh: np.ndarray,
    fc: ForwardCache,
    need: set[str],
    grads: MutableMapping[str, np.ndarray],
    train_lora: bool,
) -> None:
    """From the gradient of the final hidden states to every trainable tensor's, added into `grads`.

    `train_lora`: whether the token_embd LoRA pair (when there is one) is being trained.
    """
    dx, dw = ops.rmsnorm_backward(dh, fc.final_norm, W[OUTPUT_NORM])
    if OUTPUT_NORM in need:
        add_grad(grads, OUTPUT_NORM, dw)
    for i in reversed(range(cfg.L)):
        if i > 0:
            prefetch_layer(W, i - 1)
        cache = fc.blocks[i]
        if fc.checkpoint:
            cos, sin, mask = inp.layer(cfg, i)
            _, cache = block_forward(
                cfg, W, lora, i, moe_layers[i], cache, cos, sin, mask, aux_coef=fc.aux_coef
            )
        assert isinstance(cache, BlockCache)
        dx = block_backward(cfg, W, lora, i, moe_layers[i], dx, cache, need, grads)
        fc.blocks[i] = None
        del cache
    if cfg.embd_scale != 1.0:
        dx = dx * dx.dtype.type(cfg.embd_scale)  # forward was: x = embedding * scale
    dW, dA, dB = ops.embedding_backward(dx, fc.emb, need_dw=TOKEN_EMBD in need)
    add_grad(grads, TOKEN_EMBD, dW)
    if train_lora and TOKEN_EMBD in lora:
        add_lora_grads(grads, TOKEN_EMBD, dA, dB)
