"""One gradient-check helper for every op and for whole models (central differences in float64).

The shape of ggml's test-grad0 and CS231n's gradient_check: perturb entries of an input in place,
evaluate a scalar function on both sides, and compare with the analytic gradient by relative error
||a - n|| / (||a|| + ||n||) over the checked entries.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def numeric_grad(f: Callable[[], float], x: np.ndarray, idx: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of f() with respect to the flat entries `idx` of x (perturbed in place)."""
    flat = x.reshape(-1)
    out = np.empty(idx.size)
    for j, i in enumerate(idx):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        out[j] = (fp - fm) / (2 * eps)
    return out


def check_grads(
    f: Callable[[], float],
    inputs: dict[str, np.ndarray],
    analytic: dict[str, np.ndarray],
    *,
    max_entries: int = 60,
    eps: float = 1e-6,
    seed: int = 0,
) -> dict[str, float]:
    """Relative error per named input; every input must be float64 and have an analytic gradient."""
    rng = np.random.default_rng(seed)
    errors = {}
    for name, x in inputs.items():
        assert x.dtype == np.float64, f"{name}: gradient checks run in float64, got {x.dtype}"
        g = analytic[name]
        assert g is not None and g.shape == x.shape, (
            f"{name}: analytic gradient {None if g is None else g.shape}"
        )
        n = x.size
        idx = np.arange(n) if n <= max_entries else rng.choice(n, size=max_entries, replace=False)
        num = numeric_grad(f, x, idx, eps)
        ana = g.reshape(-1)[idx]
        denom = np.linalg.norm(ana) + np.linalg.norm(num)
        errors[name] = float(np.linalg.norm(ana - num) / denom) if denom > 0 else 0.0
    return errors


def assert_grads_close(errors: dict[str, float], tol: float = 1e-6) -> None:
    bad = {k: v for k, v in errors.items() if not v <= tol}
    shown = {k: f"{v:.2e}" for k, v in bad.items()}
    assert not bad, f"relative gradient errors above {tol:g}: {shown}"
