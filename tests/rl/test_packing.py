"""Packed (shared-prefix) micro-batches compute what padded ones do: per-token log-probs and every
parameter's gradient equal to 1e-5 (float32) for TP=1, TP=2 and PP=2, on a batch with mixed prompt
and response lengths, a group split across micro-batches and a single-sample prompt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kuberl.operator.testing.waiting import free_port

WORKER = Path(__file__).parent / "workers" / "layout_check.py"

# Prompt a (5 tokens) with three samples, b (3) with one, c (7) with two; micro-batches of two rows
# put a's third sample beside b. A later sample's second token is the first that depends on the
# positions continuing from the prompt's end (RoPE is relative: a shifted start alone changes nothing).
PROMPTS = [[1, 5, 9, 20, 33]] * 3 + [[1, 7, 7]] + [[4, 4, 4, 4, 4, 4, 8]] * 2
RESPONSES = [[11, 12, 13], [14, 30, 31, 32], [15, 16, 17, 18, 19], [21, 22], [23, 24, 25, 26], [27, 28]]


def layouts(model: Path, tmp_path: Path, tp: int, pp: int) -> list[dict]:
    torch.save({"prompts": PROMPTS, "responses": RESPONSES, "micro_batch_size": 2}, tmp_path / "batch.pt")
    port, world = free_port(), tp * pp
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--rank", str(r), "--world", str(world), "--port", str(port),
                               "--tp", str(tp), "--pp", str(pp), "--model", str(model), "--batch", str(tmp_path / "batch.pt"),
                               "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output[-3000:]
    return [torch.load(tmp_path / f"out-{r}") for r in range(world)]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_packed_and_shared_prefix_equal_the_padded_path(tiny_model: Path, tmp_path: Path, tp: int, pp: int) -> None:
    for rank, out in enumerate(layouts(tiny_model, tmp_path, tp, pp)):
        mask, padded = out["mask"], out["padded"]
        assert padded["grads"] and all(g.abs().sum() > 0 for n, g in padded["grads"].items() if "layers" in n)
        for name in ("packed", "shared"):
            got = out[name]
            assert torch.allclose(got["logprobs"] * mask, padded["logprobs"] * mask, atol=1e-5), (rank, name)
            for param, grad in padded["grads"].items():
                assert torch.allclose(got["grads"][param], grad, atol=1e-5, rtol=1e-4), (rank, name, param)
        # Computed positions: a shared prompt is computed once (without sharing, rows are the padded
        # ones). A pipeline pads every micro-batch to one shape, which on a batch this small costs more.
        if pp == 1:
            assert out["shared"]["tokens"] < padded["tokens"] and out["packed"]["tokens"] <= padded["tokens"]
