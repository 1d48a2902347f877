"""The critic's value loss and its vf_clipfrac, against verl's compute_value_loss (core_algos.py)
computed here in plain Python: V' = clip(V, V_old - c, V_old + c), loss = 0.5 · agg(max((V - R)², (V' - R)²)),
vf_clipfrac = mean over the tokens of [(V' - R)² > (V - R)²]. The batch has padding holding junk and
an empty response."""

from __future__ import annotations

import pytest
import torch

from kuberl.engine import algorithms as A
from kuberl.engine.config.algorithm import AlgorithmSpec
from kuberl.engine.training.loss_scale import UpdateTotals
from kuberl.engine.training.losses import value_loss_fn
from kuberl.engine.training.sequences import pack

MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
VALUES = [[1.5, 0.1, -0.4, 2.0], [0.9, 0.3, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0], [0.0, -1.0, 0.45, 9.0]]
OLD = [[1.0, 0.0, -0.1, 2.5], [1.0, 0.6, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.4, 0.0]]
RETURNS = [[2.0, -0.5, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, -2.0, 0.5, 0.0]]
CLIP = 0.2
B, T = len(MASK), len(MASK[0])
TOKENS = [(i, k) for i in range(B) for k in range(T) if MASK[i][k]]


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def verl_token(i: int, k: int, clip: float = CLIP) -> tuple[float, bool]:
    """verl's per-token value loss before the 0.5 and whether the clipped side is the larger."""
    v, old, r = VALUES[i][k], OLD[i][k], RETURNS[i][k]
    clipped = min(max(v, old - clip), old + clip)
    first, second = (v - r) ** 2, (clipped - r) ** 2
    return max(first, second), second > first


def verl_aggregate(per_token: dict[tuple[int, int], float], mode: str) -> float:
    rows = [i for i in range(B) if sum(MASK[i])]
    sums = {i: sum(per_token[i, k] for k in range(T) if MASK[i][k]) for i in rows}
    if mode == "token_mean":
        return sum(sums.values()) / len(TOKENS)
    if mode == "seq_mean_token_mean":
        return sum(sums[i] / sum(MASK[i]) for i in rows) / len(rows)
    return sum(sums.values()) / len(rows)  # seq_mean_token_sum


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_value_loss_and_vf_clipfrac_are_verls(mode: str) -> None:
    per_token = {(i, k): verl_token(i, k)[0] for i, k in TOKENS}
    chosen = [verl_token(i, k)[1] for i, k in TOKENS]
    assert 0 < sum(chosen) < len(chosen)  # the example has tokens on both sides
    loss, stats = A.value_loss(t(VALUES), t(OLD), t(RETURNS), t(MASK), CLIP, mode)
    assert float(loss) == pytest.approx(0.5 * verl_aggregate(per_token, mode), rel=1e-5)
    assert float(stats["vf_clipfrac"]) == pytest.approx(sum(chosen) / len(chosen))


def test_without_value_clipping_no_token_takes_the_clipped_loss() -> None:
    loss, stats = A.value_loss(t(VALUES), t(OLD), t(RETURNS), t(MASK), 0.0)
    expected = sum((VALUES[i][k] - RETURNS[i][k]) ** 2 for i, k in TOKENS) / len(TOKENS)
    assert float(loss) == pytest.approx(0.5 * expected, rel=1e-5) and float(stats["vf_clipfrac"]) == 0.0


def test_the_critics_loss_reports_vf_clipfrac() -> None:
    """The critic's training loss (whose stats become critic/<name> in a step's metrics) carries it."""
    rows = [i for i in range(B) if sum(MASK[i])]
    mb = pack([[1, 2]] * len(rows), [[5] * sum(MASK[i]) for i in rows], 0)
    grid = mb.mask.shape[1]
    mb.old_values = t([OLD[i][:grid] for i in rows]) * mb.mask
    mb.returns = t([RETURNS[i][:grid] for i in rows]) * mb.mask
    flat = t([VALUES[i][k] for i in rows for k in range(T) if MASK[i][k]])  # the values at the response tokens, in order
    spec = AlgorithmSpec.model_validate({"name": "ppo", "ppo": {"valueClip": CLIP}})
    _, stats = value_loss_fn(spec)(flat, mb, UpdateTotals.alone([mb]))
    chosen = [verl_token(i, k)[1] for i, k in TOKENS]
    assert float(stats["vf_clipfrac"]) == pytest.approx(sum(chosen) / len(chosen))
    assert set(stats) == {"value_loss", "vf_clipfrac"}


def test_a_step_exports_vf_clipfrac() -> None:
    """A step's critic/vf_clipfrac is a gauge on the controller rank (and so in the metrics reference)."""
    from kuberl.engine.runtime.metrics import RunMetrics

    metrics = RunMetrics("job", port=None, jsonl=None)
    metrics.record({"step": 1, "critic/vf_clipfrac": 0.25})
    assert metrics.registry.get_sample_value("kuberl_critic_vf_clipfrac", {"rljob": "job"}) == 0.25
