"""Preference training: DPO and ORPO on pairs of a chosen and a rejected answer (DESIGN.md §2.7).

Both objectives are functions of each answer's log-probability under the model being trained,
log pi(y | x) = sum_t log p(y_t | x, y_<t) over the answer's tokens (its end-of-turn included):

- DPO (Rafailov et al. 2023): with the reference policy's log-probabilities ref(y | x),
  z = beta [(log pi(y_c) - ref(y_c)) - (log pi(y_r) - ref(y_r))], loss = mean over pairs of
  -log sigmoid(z). The reference policy is the same session's model with the adapter off (LoRA
  terms left out, full-weight tensors at their original values): no second copy of the weights.
  It never changes during a run, so each pair's reference log-probabilities are computed once,
  the first time the pair is met, and kept. The implicit rewards are beta (log pi - ref).
- ORPO (Hong et al. 2024), with no reference: with l = the mean token log-probability of an
  answer and odds(y) = P / (1 - P), P = exp(l): loss = mean over pairs of
  -l_c + lambda * -log sigmoid(log odds(y_c) - log odds(y_r)), the first term the SFT loss on the
  chosen answer (per token). Rewards are lambda * l, as TRL reports them.

Both are computed from the per-sequence cross-entropies the fused output head gives
(`engine.train.train_model.loss_and_grads(sequence_loss=...)`): the objective's gradient with
respect to each answer's summed log-probability becomes a per-token weight (dL/d ce_t =
-dL/d log pi), and the ordinary weighted cross-entropy backward pass then gives the gradient of the
objective exactly. `dpo_loss_forward`/`dpo_loss_backward` and the ORPO pair are the scalar parts,
checked against finite differences in float64 (tests/engine/test_preferences.py), as is the
whole model's gradient.

Figures per batch (`PreferenceFigures`): the loss, the mean token log-probability of the chosen
and rejected answers, the mean rewards, the reward margin (chosen - rejected) and the preference
accuracy (the share of pairs whose margin is positive; a tie counts half, so an untrained
adapter, equal to the reference, scores 0.5 under DPO).

What this module is not: it reads no files (engine.train.pref_data) and runs no loop
(engine.train.trainer does, with `TrainConfig.objective`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pref_data import PairBatch
from .train_model import LossResult, SequenceObjective, Trainable, loss_and_grads

OBJECTIVES = ("dpo", "orpo")
_MAX_MEAN_LOGP = -1e-6  # ORPO's log odds need P < 1: a mean log-probability is clipped below 0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def dpo_loss_forward(pc, pr, rc, rr, beta: float):
    """DPO over P pairs: pc, pr the policy's summed log-probabilities of the chosen and rejected
    answers (P,), rc, rr the reference's. loss = mean_i -log sigmoid(beta ((pc - rc) - (pr - rr)))."""
    pc, pr, rc, rr = (np.asarray(a, dtype=np.float64) for a in (pc, pr, rc, rr))
    z = beta * ((pc - rc) - (pr - rr))  # (P,)
    loss = float(_softplus(-z).mean())
    return loss, (z, beta, pc.size)


def dpo_loss_backward(cache):
    """(dpc, dpr) of dpo_loss_forward. forward was: loss = mean softplus(-z), z = beta (pc - pr - rc + rr)."""
    z, beta, P = cache
    dz = -_sigmoid(-z) / P  # d softplus(-z)/dz = -sigmoid(-z)
    return beta * dz, -beta * dz


def _log_odds(lp: np.ndarray) -> np.ndarray:
    """log(P / (1 - P)) for P = exp(lp), lp < 0."""
    return lp - np.log(-np.expm1(lp))


def orpo_loss_forward(pc, pr, nc, nr, lam: float):
    """ORPO over P pairs: pc, pr summed log-probabilities (P,), nc, nr the answers' token counts.
    With l = p / n: loss = mean_i [-l_c + lam softplus(-(log odds(l_c) - log odds(l_r)))]."""
    pc, pr, nc, nr = (np.asarray(a, dtype=np.float64) for a in (pc, pr, nc, nr))
    lc = np.minimum(pc / nc, _MAX_MEAN_LOGP)
    lr = np.minimum(pr / nr, _MAX_MEAN_LOGP)
    x = _log_odds(lc) - _log_odds(lr)  # (P,)
    loss = float((-lc + lam * _softplus(-x)).mean())
    clipped = (pc / nc > _MAX_MEAN_LOGP, pr / nr > _MAX_MEAN_LOGP)
    return loss, (lc, lr, x, nc, nr, lam, clipped)


def orpo_loss_backward(cache):
    """(dpc, dpr) of orpo_loss_forward. forward was: loss = mean(-l_c + lam softplus(-x)),
    x = lo(l_c) - lo(l_r), lo(l) = l - log(1 - e^l) (dlo/dl = 1 / (1 - e^l)), l = p / n."""
    lc, lr, x, nc, nr, lam, (clip_c, clip_r) = cache
    P = lc.size
    dx = -lam * _sigmoid(-x) / P
    dlc = -1.0 / P + dx * (-1.0 / np.expm1(lc))
    dlr = -dx * (-1.0 / np.expm1(lr))
    dlc = np.where(clip_c, -1.0 / P, dlc)  # l clipped at its bound: the odds term does not move
    dlr = np.where(clip_r, 0.0, dlr)
    return dlc / nc, dlr / nr


@dataclass(frozen=True)
class PreferenceFigures:
    """What a batch (or the held-out pairs) shows of a preference objective."""

    loss: float  # the objective, mean over pairs
    chosen_logp: float  # mean log-probability per token of the chosen answers
    rejected_logp: float  # ... of the rejected answers
    chosen_reward: float  # DPO: beta (log pi - log ref) of the answer; ORPO: lambda x its mean token log-prob
    rejected_reward: float
    margin: float  # mean over pairs of chosen - rejected reward
    accuracy: float  # share of pairs with a positive margin (ties count half)
    n_pairs: int


def figures(loss: float, pc, pr, nc, nr, rewards_c, rewards_r) -> PreferenceFigures:
    margin = np.asarray(rewards_c) - np.asarray(rewards_r)
    acc = float(np.mean((margin > 0) + 0.5 * (margin == 0))) if margin.size else float("nan")
    return PreferenceFigures(
        float(loss), float(np.mean(pc / nc)), float(np.mean(pr / nr)), float(np.mean(rewards_c)),
        float(np.mean(rewards_r)), float(margin.mean()), acc, int(margin.size),
    )  # fmt: skip


def merge_figures(parts: list[PreferenceFigures]) -> PreferenceFigures:
    """Figures of several batches as one, each weighted by its pairs."""
    n = np.array([p.n_pairs for p in parts], dtype=np.float64)
    total = float(n.sum())

    def mean(name: str) -> float:
        return float(sum(getattr(p, name) * k for p, k in zip(parts, n, strict=True)) / max(total, 1.0))

    names = ("loss", "chosen_logp", "rejected_logp", "chosen_reward", "rejected_reward", "margin", "accuracy")
    return PreferenceFigures(*(mean(k) for k in names), int(total))


def _masks(batch: PairBatch) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Per sequence s (2j chosen, 2j + 1 rejected): the batch's targets with every other row set to
    -1, and the row -> sequence map and label-token count per sequence."""
    targets = np.asarray(batch.targets).reshape(-1)
    seq = np.asarray(batch.sample_ids).reshape(-1)
    seq = np.where(targets >= 0, seq, -1)
    S = 2 * batch.n_pairs
    masked = [np.where(seq == s, targets, -1) for s in range(S)]
    counts = np.bincount(seq[seq >= 0], minlength=S).astype(np.float64)
    return masked, seq, counts


class PreferenceObjective:
    """DPO or ORPO on a model: the batch losses, gradients and figures (see the module docstring)."""

    def __init__(self, model, objective: str, *, beta: float = 0.1, lam: float = 0.1):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        self.model = model
        self.objective = objective
        self.beta = float(beta)
        self.lam = float(lam)
        self._ref: dict[int, tuple[float, float]] = {}  # pair id -> reference (chosen, rejected) log pi
        self._base = Trainable(1, 1.0, {}, {})  # nothing trained: the model with the adapter off

    def reference(self, batch: PairBatch) -> tuple[np.ndarray, np.ndarray]:
        """The reference policy's summed log-probabilities of the batch's chosen and rejected answers,
        computed once per pair (the model with the adapter off) and kept."""
        ids = [int(i) for i in batch.pair_ids]
        if any(i not in self._ref for i in ids):
            masked, _, _ = _masks(batch)

            def collect(ce) -> SequenceObjective:
                logp = -np.array([ce(m) for m in masked])
                for j, i in enumerate(ids):
                    self._ref[i] = (float(logp[2 * j]), float(logp[2 * j + 1]))
                return SequenceObjective(0.0, np.zeros(len(masked[0]) if masked else 0))

            loss_and_grads(self.model, self._base, batch, backward=False, sequence_loss=collect)
        ref = np.array([self._ref[i] for i in ids], dtype=np.float64).reshape(-1, 2)
        return ref[:, 0], ref[:, 1]

    def _sequence_loss(self, batch: PairBatch):
        masked, seq, counts = _masks(batch)
        nc, nr = counts[0::2], counts[1::2]
        rc = rr = None
        if self.objective == "dpo":
            rc, rr = self.reference(batch)

        def sequence_loss(ce) -> SequenceObjective:
            logp = -np.array([ce(m) for m in masked], dtype=np.float64)  # (2P,) summed log-probabilities
            pc, pr = logp[0::2], logp[1::2]
            if self.objective == "dpo":
                loss, cache = dpo_loss_forward(pc, pr, rc, rr, self.beta)
                dpc, dpr = dpo_loss_backward(cache)
                rew_c, rew_r = self.beta * (pc - rc), self.beta * (pr - rr)
            else:
                loss, cache = orpo_loss_forward(pc, pr, nc, nr, self.lam)
                dpc, dpr = orpo_loss_backward(cache)
                rew_c, rew_r = self.lam * pc / nc, self.lam * pr / nr
            dlogp = np.empty_like(logp)
            dlogp[0::2], dlogp[1::2] = dpc, dpr
            # log pi = -sum ce: dL/d ce_t = -dL/d log pi of the token's sequence
            weights = np.where(seq >= 0, -dlogp[np.maximum(seq, 0)], 0.0)
            return SequenceObjective(loss, weights, figures(loss, pc, pr, nc, nr, rew_c, rew_r))

        return sequence_loss

    def loss_and_grads(
        self, trainable: Trainable, batch: PairBatch, *, backward: bool = True, checkpoint: bool = False
    ) -> LossResult:
        """The objective on one batch of pairs, its gradients, and its figures (`LossResult.extra`)."""
        return loss_and_grads(self.model, trainable, batch, backward=backward, checkpoint=checkpoint,
                              sequence_loss=self._sequence_loss(batch))  # fmt: skip

    def evaluate(self, trainable: Trainable, batches: list[PairBatch]) -> PreferenceFigures | None:
        """Figures of held-out batches (forward passes only); None when there are none."""
        parts = [self.loss_and_grads(trainable, b, backward=False).extra for b in batches if b.n_pairs]
        return merge_figures(parts) if parts else None


__all__ = [
    "dpo_loss_backward", "dpo_loss_forward", "figures", "merge_figures", "OBJECTIVES", "orpo_loss_backward",
    "orpo_loss_forward", "PreferenceFigures", "PreferenceObjective",
]  # fmt: skip
