"""The CPU twin of the MoE experts: `experts_forward_cpu` / `experts_backward_cpu`, the same arguments
and results as `engine.kernels.moe.experts_forward_ref` / `experts_backward_ref`, computed the way
the CPU runs them fastest.

Two things make it faster than the reference's plain loop (bench/CPU_NOTES.md has the figures):
- experts are independent pieces: with more than one CPU worker (engine.kernels.cpu_workers) they
  run side by side, each writing only its own rows and its own slices of the gradients, so the
  results are the same bits in line or on workers; pieces too small to pay for the hand-off
  (`experts_in_line`) run in line;
- an expert the weight store can give as int8 codes (`ExpertStack.codes`: most quantized types,
  engine.kernels.blockq) is multiplied straight from them, forward by W_e and backward by its
  transpose where the store keeps one (with a cache too small for every expert's codes, the
  backward's products are float, `WeightStore.expert_codes`) (engine.kernels.blockq_cpu): with the
  few rows an expert gets (~32), reading and packing a float32 copy cost OpenBLAS as much as the
  products. The codes' kernel runs on one thread, so
  codes are used where each expert gets one thread anyway (`codes_pay`: on CPU workers, or BLAS on
  one thread); in line beside a multi-threaded BLAS the float experts' products use every thread.
  The engine sets both counts together each step (engine.train.threads), so a run keeps one path;
- else each expert's base product is taken as (W_e xe^T)^T: with the few rows an expert gets (~32),
  OpenBLAS runs the (n_out, n_in) x (n_in, n_e) form 35-45% faster than (n_e, n_in) x (n_in, n_out);
  y is then a column-major view, which every later use takes as it is, and the LoRA term is formed
  in the same transposed layout, so adding it is a contiguous pass.

The parity test (tests/kernels/test_moe_cpu_parity.py) holds it to the reference with the helper
the CUDA twins use (tests/kernels/twin.py), in line and on two workers. Routing has no CPU twin: the
reference is the CPU's. Not here: the GPU twins (engine.kernels.moe_cuda).
"""

from __future__ import annotations

import numpy as np

from . import jit
from .blockq import BlockQ
from .blockq_cpu import xwt_cpu
from .cpu_workers import PIECE_MIN_FLOPS, blas_threads, run_each, workers
from .glu import GluCache
from .glu_cpu import glu_backward_cpu, glu_forward_cpu
from .linear import LoraTerm
from .moe import ExpertActs, ExpertsCache, Routing, check_expert_act, zero_grads


def routed_experts(routing: Routing) -> list[int]:
    """The experts that received at least one token-slot pair, in id order."""
    return np.flatnonzero(np.diff(routing.offsets) > 0).tolist()


def experts_in_line(routing: Routing, C: int, F: int) -> bool:
    """Whether the experts' pieces are too small for CPU workers: the three products' FLOPs of an
    average routed expert under `PIECE_MIN_FLOPS` (engine.kernels.cpu_workers)."""
    routed = max(1, int(np.count_nonzero(np.diff(routing.offsets))))
    return 6.0 * len(routing.order) * C * F / routed < PIECE_MIN_FLOPS


def codes_pay() -> bool:
    """Whether experts are multiplied from their codes now: compiled, and on CPU workers or with BLAS
    on one thread (see the module docstring)."""
    return (workers() > 1 or blas_threads() <= 1) and jit.enabled()


def expert_codes(w, e: int, use: bool, transposed: bool = False) -> BlockQ | None:
    """Expert e of stack w as int8 codes (or their transpose, for the backward) where `use` and the
    weight store gives them (`ExpertStack.codes`); else None."""
    codes = getattr(w, "codes", None) if use else None
    return codes(e, transposed) if codes is not None else None


def expert_linear(xe: np.ndarray, w, lora: LoraTerm | None, e: int, codes: bool):
    """Expert e's projection of its rows: (xe W_e^T (+ s (xe A_e^T) B_e^T), xa = xe A_e^T or None):
    from the expert's codes where it has them, else column-major views of products taken in the
    transposed layout (see the module docstring). `codes`: whether codes may be used."""
    wq = expert_codes(w, e, codes)
    if wq is not None:
        y = xwt_cpu(xe, wq)  # (n_e, n_out)
        if lora is None:
            return y, None
        xa = xe @ lora.A[e].T  # (n_e, r)
        y += (lora.s * xa) @ lora.B[e].T
        return y, xa
    yT = w[e] @ xe.T  # (n_out, n_e)
    if lora is None:
        return yT.T, None
    xaT = lora.A[e] @ xe.T  # (r, n_e)
    yT += lora.B[e] @ (lora.s * xaT)  # in yT's own layout: a contiguous add, the scale on the small factor
    return yT.T, xaT.T


def expert_linear_backward(dy: np.ndarray, xe: np.ndarray, xa, w, lora: LoraTerm | None, e: int, dlora,
                           codes: bool):  # fmt: skip
    """Backward of `expert_linear`: returns dxe; writes expert e's (dA, dB) into `dlora` (a pair of
    (E, ...) arrays, or None without LoRA) as the outer products of its rows (OUT_PROD_ID)."""
    wt = expert_codes(w, e, codes, transposed=True)
    dx = xwt_cpu(dy, wt) if wt is not None else dy @ w[e]
    if lora is not None:
        dyB = lora.s * (dy @ lora.B[e])  # (n_e, r), scaled: the products below need no scaling pass
        dx += dyB @ lora.A[e]
        np.matmul(dyB.T, xe, out=dlora[0][e])
        np.matmul(dy.T, lora.s * xa, out=dlora[1][e])
    return dx


def experts_forward_cpu(
    x: np.ndarray,
    routing: Routing,
    w_gate,
    w_up,
    w_down,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
    *,
    b_gate: np.ndarray | None = None,
    b_up: np.ndarray | None = None,
    b_down: np.ndarray | None = None,
    act: str = "silu",
):
    """CPU twin of `experts_forward_ref` (same arguments and results)."""
    check_expert_act(act)
    N, C = x.shape
    K = routing.topk.shape[1]
    pair_out = np.zeros((N * K, C), dtype=x.dtype)
    codes = codes_pay()

    def expert(e: int) -> ExpertActs:  # writes expert e's rows of pair_out
        pairs = routing.order[routing.offsets[e] : routing.offsets[e + 1]]
        xe = x[pairs // K]  # (n_e, C)
        g, xa_g = expert_linear(xe, w_gate, lora_gate, e, codes)  # (n_e, F)
        u, xa_u = expert_linear(xe, w_up, lora_up, e, codes)
        if b_gate is not None:
            g = g + b_gate[e]
        if b_up is not None:
            u = u + b_up[e]
        h, c_act = glu_forward_cpu(g, u, act)
        ye, ha_d = expert_linear(h, w_down, lora_down, e, codes)  # (n_e, C)
        if b_down is not None:
            ye = ye + b_down[e]
        pair_out[pairs] = ye
        return ExpertActs(e, pairs, g, u, c_act.a, h, xa_g, xa_u, ha_d)

    in_line = experts_in_line(routing, C, w_gate.shape[1])  # too small for CPU workers
    per_expert = run_each(expert, routed_experts(routing), in_line=in_line)
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    biases = (b_gate is not None, b_up is not None, b_down is not None)
    return y, ExpertsCache(x, routing, pair_out, per_expert, (lora_gate, lora_up, lora_down), biases, act)


def experts_backward_cpu(dy: np.ndarray, cache: ExpertsCache, w_gate, w_up, w_down, need_dw: bool = False,
                         need_db: bool = False):  # fmt: skip
    """CPU twin of `experts_backward_ref` (same arguments and results)."""
    x, routing, pair_out, per_expert, loras, biases, act = cache
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    dW, dlora, db = zero_grads((w_gate, w_up, w_down), loras, biases, need_dw, need_db, dy.dtype)
    codes = codes_pay()

    def expert(acts: ExpertActs) -> None:  # writes expert e's rows of dx_pairs and slices of dW, db, dlora
        e, pairs, g, u, a, h, xa_g, xa_u, ha_d = acts
        xe = x[pairs // K]  # (n_e, C)
        do_e = do[pairs]  # (n_e, C)
        dh = expert_linear_backward(do_e, h, ha_d, w_down, lora_down, e, dlora.get("down"), codes)  # (n_e, F)
        dg, du = glu_backward_cpu(dh, GluCache(g, u, a, act))
        dxe = expert_linear_backward(dg, xe, xa_g, w_gate, lora_gate, e, dlora.get("gate"), codes)
        dxe += expert_linear_backward(du, xe, xa_u, w_up, lora_up, e, dlora.get("up"), codes)
        if need_dw:
            dW["down"][e] = do_e.T @ h
            dW["gate"][e] = dg.T @ xe
            dW["up"][e] = du.T @ xe
        if db is not None:
            for name, d in (("gate", dg), ("up", du), ("down", do_e)):
                if name in db:
                    db[name][e] = d.sum(axis=0)
        dx_pairs[pairs] = dxe

    run_each(expert, per_expert, in_line=experts_in_line(routing, C, w_gate.shape[1]))
    dx = dx_pairs.reshape(N, K, C).sum(axis=1)
    return dx, dweights, dW, dlora, db
