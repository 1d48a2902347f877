"""The policy's response log-probs and entropy (logits only at response positions) against transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kuberl.operator.cli.ports import free_port

WORKER = Path(__file__).parent / "workers" / "policy_check.py"


def run(model: Path, batch: Path, out: Path, tp: int = 1, temperature: float = 1.0) -> dict:
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--rank",
                str(r),
                "--world",
                str(tp),
                "--port",
                str(port),
                "--tp",
                str(tp),
                "--model",
                str(model),
                "--batch",
                str(batch),
                "--out",
                str(out),
                "--temperature",
                str(temperature),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(tp)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("tp,temperature", [(1, 1.0), (2, 1.0), (2, 0.7)])
def test_response_logprobs_and_entropy_match_transformers(tiny_model: Path, tmp_path: Path, tp: int, temperature: float) -> None:
    """At temperature T the policy is softmax(logits / T), the distribution vLLM samples from."""
    import transformers

    prompts = [[1, 5, 9, 20, 33], [1, 7, 7], [4, 4, 4, 4, 4, 4]]
    responses = [[11, 12, 13], [14], [15, 16, 17, 18, 19]]
    torch.save({"prompts": prompts, "responses": responses}, tmp_path / "batch.pt")
    got = run(tiny_model, tmp_path / "batch.pt", tmp_path / "out.pt", tp, temperature)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for b, (p, r) in enumerate(zip(prompts, responses)):
        with torch.no_grad():
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp = torch.log_softmax(logits / temperature, -1)
        expected = logp.gather(1, torch.tensor(r)[:, None])[:, 0]
        entropy = -(logp.exp() * logp).sum(-1)
        n = len(r)
        assert torch.allclose(got["logprobs"][b, :n], expected, atol=1e-4), (got["logprobs"][b], expected)
        assert torch.allclose(got["loss_logprobs"][b, :n], expected, atol=1e-4)
        assert torch.allclose(got["entropy"][b, :n], entropy, atol=1e-4), (got["entropy"][b], entropy)
        assert torch.all(got["logprobs"][b, n:] == 0) and torch.all(got["mask"][b, n:] == 0)
    # A fresh value head is zero: the critic's values start at 0 (and have the response's shape).
    assert got["values"].shape == got["mask"].shape and torch.all(got["values"] == 0)
