"""The forward and backward operations the model is built from, by the names model code calls.

Each op is a pure function `op_forward(...) -> (out, cache)` in the style of llm.c: `cache` (a
named tuple) holds the activations a matching `op_backward(dout, cache, ...)` needs, so that
training code can pair them; inference simply drops it. Caches never hold weights: a backward is
given the weights it needs (llm.c's `matmul_backward(..., weight, ...)`), so the weight store may
drop a dequantized layer between its forward and its backward.

Weights are NumPy arrays, or the weight store's lazy views: an expert stack is anything indexable
by expert id giving that expert's (n_out, n_in) matrix; the embedding and the output head accept a
view with `take_rows(ids)` and `row_chunks()`, so that a large vocabulary is dequantized a block of
rows at a time. Shapes use the house vocabulary (B batch, T tokens, C channels, NH/NKV heads, HS
head size, E experts, K experts per token, F ffn width, r LoRA rank). The functions work in
whatever float dtype they are given (float32 in use, float64 in tests).

The implementations live in `engine.kernels.<op>`: each `<op>_ref` there is the NumPy reference,
the specification of the op. This module gives model code one name per op. It knows no GGUF names
and holds no state; `engine.model.layers` and `engine.model.forward` wire the ops into models.
"""

from __future__ import annotations

from ..kernels.attention import (
    AttentionCache,
    attention_backward_ref,
    attention_forward_ref,
    attention_mask,
)
from ..kernels.cross_entropy import lm_head_loss_ref, project, softmax
from ..kernels.embedding import (
    EmbeddingCache,
    embedding_backward_ref,
    embedding_forward_ref,
    row_chunks,
    scatter_add_rows,
    take_rows,
)
from ..kernels.linear import LinearCache, LoraTerm, linear_backward_ref, linear_forward_ref
from ..kernels.moe import (
    ExpertActs,
    ExpertsCache,
    RouteCache,
    Routing,
    experts_backward_ref,
    experts_forward_ref,
    route_backward_ref,
    route_forward_ref,
)
from ..kernels.norm import NormCache, rmsnorm_backward_ref, rmsnorm_forward_ref
from ..kernels.rope import RopeCache, rope_angles, rope_backward_ref, rope_forward_ref
from ..kernels.swiglu import SwigluCache, sigmoid, silu, swiglu_backward_ref, swiglu_forward_ref

embedding_forward = embedding_forward_ref
embedding_backward = embedding_backward_ref
rmsnorm_forward = rmsnorm_forward_ref
rmsnorm_backward = rmsnorm_backward_ref
linear_forward = linear_forward_ref
linear_backward = linear_backward_ref
rope_forward = rope_forward_ref
rope_backward = rope_backward_ref
attention_forward = attention_forward_ref
attention_backward = attention_backward_ref
swiglu_forward = swiglu_forward_ref
swiglu_backward = swiglu_backward_ref
route_forward = route_forward_ref
route_backward = route_backward_ref
experts_forward = experts_forward_ref
experts_backward = experts_backward_ref
lm_head_loss = lm_head_loss_ref

__all__ = [
    "AttentionCache", "EmbeddingCache", "ExpertActs", "ExpertsCache", "LinearCache", "LoraTerm",
    "NormCache", "RopeCache", "RouteCache", "Routing", "SwigluCache", "attention_backward",
    "attention_forward", "attention_mask", "embedding_backward", "embedding_forward", "experts_backward",
    "experts_forward", "linear_backward", "linear_forward", "lm_head_loss", "project", "rmsnorm_backward",
    "rmsnorm_forward", "rope_angles", "rope_backward", "rope_forward", "route_backward", "route_forward",
    "row_chunks", "scatter_add_rows", "sigmoid", "silu", "softmax", "swiglu_backward", "swiglu_forward",
    "take_rows",
]  # fmt: skip
