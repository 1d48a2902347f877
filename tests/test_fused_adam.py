"""The trainer's Adam runs torch's fused kernel, and it computes what the per-tensor loop does."""

from __future__ import annotations

import torch

from kuberl.engine.training.optimizer import _fuse_adam


def _steps(fused: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (7, 300, 4096)]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    if fused:
        _fuse_adam(optimizer)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach() for p in params]


def test_the_fused_adam_takes_the_loops_steps() -> None:
    for fused, loop in zip(_steps(True), _steps(False)):
        assert torch.allclose(fused, loop, atol=1e-6, rtol=1e-5)


def test_adam_is_fused_and_sgd_left_alone() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    adam, sgd = torch.optim.Adam([p]), torch.optim.SGD([p], lr=0.1)
    _fuse_adam(adam)
    _fuse_adam(sgd)
    assert adam.param_groups[0]["fused"] is True and adam.param_groups[0]["foreach"] is False
    assert not sgd.param_groups[0].get("fused")
