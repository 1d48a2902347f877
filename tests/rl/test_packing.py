"""Packed (shared-prefix) micro-batches compute what padded ones do: per-token log-probs and every
parameter's gradient equal to 1e-5 (float32) for TP=1, TP=2 and PP=2, on a batch with mixed prompt
and response lengths, a group split across micro-batches and a single-sample prompt. And an update
of the real policy loss does not depend on how its mini-batch is cut into micro-batches and DP
shards (loss_scale.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kuberl.operator.cli.ports import free_port

WORKER = Path(__file__).parent / "workers" / "layout_check.py"

# Prompt a (5 tokens) with three samples, b (3) with one, c (7) with two; micro-batches of two rows
# put a's third sample beside b. A later sample's second token is the first that depends on the
# positions continuing from the prompt's end (RoPE is relative: a shifted start alone changes nothing).
# a's first two answers (5 tokens each, 4 of them fed to the model) are long enough against its prompt
# that a short attention span splits their shared segment (packing._split_run: 13^2 - 2 x 9^2 = 7 pairs
# more in one segment than in two, which costs more than the 5 prompt tokens two segments repeat).
PROMPTS = [[1, 5, 9, 20, 33]] * 3 + [[1, 7, 7]] + [[4, 4, 4, 4, 4, 4, 8]] * 2
RESPONSES = [[11, 12, 13, 40, 41], [14, 30, 31, 32, 34], [15, 16, 17, 18, 19], [21, 22], [23, 24, 25, 26], [27, 28]]


_RUNS: dict[tuple[int, int, int], list[dict]] = {}


def same_gradient(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to float32 sums run in another order: 1e-5 absolute on a gradient whose entries are
    at most about 1 (a token mean), scaled with its largest entry beyond that. A token sum's gradient
    is the token count times larger, and so is its rounding (measured 2.3e-5 on the tied embedding,
    whose largest entry is 7.4, on an AVX-512 CPU)."""
    scale = max(1.0, float(want.abs().max()))
    return torch.allclose(got, want, atol=1e-5 * scale, rtol=1e-4)


def layouts(model: Path, tmp_path: Path, tp: int, pp: int, dp: int = 1) -> list[dict]:
    """Each rank's results (workers/layout_check.py), one run per parallel layout for the module."""
    if (tp, pp, dp) in _RUNS:
        return _RUNS[tp, pp, dp]
    torch.save({"prompts": PROMPTS, "responses": RESPONSES, "micro_batch_size": 2}, tmp_path / "batch.pt")
    port, world = free_port(), tp * pp * dp
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--rank",
                str(r),
                "--world",
                str(world),
                "--port",
                str(port),
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                "--model",
                str(model),
                "--batch",
                str(tmp_path / "batch.pt"),
                "--out",
                str(tmp_path / "out"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output[-3000:]
    _RUNS[tp, pp, dp] = [torch.load(tmp_path / f"out-{r}") for r in range(world)]
    return _RUNS[tp, pp, dp]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_packed_and_shared_prefix_equal_the_padded_path(tiny_model: Path, tmp_path: Path, tp: int, pp: int) -> None:
    for rank, out in enumerate(layouts(tiny_model, tmp_path, tp, pp)):
        mask, padded = out["mask"], out["padded"]
        assert padded["grads"] and all(g.abs().sum() > 0 for n, g in padded["grads"].items() if "layers" in n)
        # The split layout did split runs into more segments.
        assert out["shared_split"]["blocks"] > out["shared"]["blocks"]
        for name in ("packed", "shared", "shared_split"):
            got = out[name]
            assert torch.allclose(got["logprobs"] * mask, padded["logprobs"] * mask, atol=1e-5), (rank, name)
            for param, grad in padded["grads"].items():
                assert torch.allclose(got["grads"][param], grad, atol=1e-5, rtol=1e-4), (rank, name, param)
        # Computed positions: no padding, and a shared prompt once. A pipeline pads every micro-batch's
        # run to the longest, which on a batch this small can cost more.
        if pp == 1:
            assert out["shared"]["tokens"] < out["packed"]["tokens"] < padded["tokens"]


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (1, 1, 2), (2, 1, 1), (1, 2, 1)])
def test_an_update_does_not_depend_on_how_its_mini_batch_is_cut(tiny_model: Path, tmp_path: Path, tp: int, pp: int, dp: int) -> None:
    """Micro-batches of one sequence, of two, or by a token budget, on one DP rank or two, give the
    gradient of the whole mini-batch in one micro-batch, for every loss aggregation."""
    for rank, out in enumerate(layouts(tiny_model, tmp_path, tp, pp, dp)):
        for aggregation, cuts in out["splits"].items():
            whole = cuts["whole"]
            assert any(g.abs().sum() > 0 for g in whole.values())
            for cut in ("one", "two", "tokens"):
                for param, grad in whole.items():
                    assert same_gradient(cuts[cut][param], grad), (rank, aggregation, cut, param)


def test_without_the_totals_a_cut_would_change_the_update() -> None:
    """The check above can fail: micro-batches of unequal token counts, each its own token mean
    (what megatron-core's mean over micro-batches gives), weigh their tokens differently from the
    mini-batch's token mean, and the scale of loss_scale.py is what puts them back."""
    from kuberl.engine.training.loss_scale import UpdateTotals
    from kuberl.engine.training.sequences import micro_batches, pack

    batch = pack(PROMPTS, RESPONSES, pad_id=0)
    per_token = torch.arange(batch.mask.numel(), dtype=torch.float32).reshape(batch.mask.shape) * batch.mask
    whole = float(per_token.sum() / batch.mask.sum())
    mbs = micro_batches(batch, 4)
    means = [float((per_token[i : i + len(mb)] * mb.mask).sum() / mb.mask.sum()) for i, mb in zip((0, 4), mbs)]
    assert abs(sum(means) / len(means) - whole) > 1e-3
    totals = UpdateTotals.of(batch, len(mbs), dp=1)
    scaled = sum(m * totals.scale(mb, "token_mean") for m, mb in zip(means, mbs)) / len(mbs)
    assert abs(scaled - whole) < 1e-5


def test_one_dp_rank_and_two_reduce_to_one_gradient(tiny_model: Path, tmp_path: Path) -> None:
    """Alone in its DP group a model skips the gradient reduce-scatter (an identity that gloo would
    still copy: training/single_dp_rank.py); its whole-batch gradient is the one two ranks reduce."""
    alone = layouts(tiny_model, tmp_path, 1, 1, 1)[0]["splits"]
    pair = layouts(tiny_model, tmp_path, 1, 1, 2)[0]["splits"]
    for aggregation, cuts in alone.items():
        for param, grad in cuts["whole"].items():
            assert same_gradient(pair[aggregation]["tokens"][param], grad), (aggregation, param)
