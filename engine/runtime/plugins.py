"""Loading a user's algorithm plug-ins: Python files that register estimators, losses and steps.

A plug-in file uses the same decorators as the built-ins (`register_advantage`,
`register_policy_loss`, `kuberl.engine.steps.register_step`, `register_preset`). Each entry it adds
is tried at once on a small made-up batch, so that a function with the wrong signature, or one that
returns NaN or the wrong shape, is refused with the file and the function named before any model
loads, not at the first step an hour later; a preset must name registered entries.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch

from ..algorithms.presets import PRESETS
from ..algorithms.registry import ADVANTAGES, POLICY_LOSSES, AdvantageInputs, Advantages, LossInputs
from ..common.user_code import import_user_file
from ..config.termination import NotRetryable
from ..steps.registry import STEPS


class PluginError(NotRetryable, ValueError):
    """A plug-in that cannot be used; the message names the file and the function."""

    reason = "UserCodeFailed"


# Part of the registries' state: a file registers its entries once per process.
_LOADED: set[Path] = set()


def load_plugins(paths: list[Path]) -> list[str]:
    """Import each file, check every entry it registers, and return the new entries' names."""
    added: list[str] = []
    for path in paths:
        if path.resolve() in _LOADED:
            continue
        registries = (ADVANTAGES, POLICY_LOSSES, STEPS, PRESETS)
        before = [set(r) for r in registries]
        try:
            import_user_file(path, "algorithm.plugins", PluginError, kind="algorithms")
            for name in sorted(set(ADVANTAGES) - before[0]):
                _check_advantage(path, name)
            for name in sorted(set(POLICY_LOSSES) - before[1]):
                _check_policy_loss(path, name)
            for name in sorted(set(STEPS) - before[2]):
                _check_step(path, name)
            for name in sorted(set(PRESETS) - before[3]):
                _check_preset(path, name)
        except PluginError:
            # A refused file leaves nothing registered.
            for registry, names in zip(registries, before):
                for name in set(registry) - names:
                    del registry[name]
            raise
        for registry, names in zip(registries, before):
            added += sorted(set(registry) - names)
        _LOADED.add(path.resolve())
    return added


def _probe() -> AdvantageInputs:
    """Four responses of three tokens to two prompts, the second response one token shorter."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    return AdvantageInputs(
        scores=torch.tensor([1.0, 0.0, 0.5, 0.25]),
        group=torch.tensor([0, 0, 1, 1]),
        mask=mask,
        values=torch.zeros(4, 3),
        greedy_scores=torch.tensor([0.5, 0.5, 0.25, 0.25]),
    )


def _where(path: Path, fn: object) -> str:
    return f"{path}: function {getattr(fn, '__name__', fn)!s}"


def _keyword_defaults(path: Path, fn: object, data_args: int) -> None:
    params = list(inspect.signature(fn).parameters.values())
    if len(params) < data_args:
        raise PluginError(
            f"algorithm.plugins: {_where(path, fn)} takes {len(params)} arguments; it must take {data_args} data arguments, then options"
        )
    missing = [p.name for p in params[data_args:] if p.default is inspect.Parameter.empty]
    if missing:
        raise PluginError(f"algorithm.plugins: {_where(path, fn)}: options need defaults ({', '.join(missing)})")


def _call(path: Path, fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except Exception as exc:
        raise PluginError(f"algorithm.plugins: {_where(path, fn)} failed on a test batch: {type(exc).__name__}: {exc}") from None


def _check_advantage(path: Path, name: str) -> None:
    fn = ADVANTAGES[name].fn
    _keyword_defaults(path, fn, 1)
    inputs = _probe()
    out = _call(path, fn, inputs)
    if not isinstance(out, Advantages):
        raise PluginError(
            f"algorithm.plugins: {_where(path, fn)} must return Advantages(advantages, returns=None), got {type(out).__name__}"
        )
    if tuple(out.advantages.shape) != tuple(inputs.mask.shape):
        raise PluginError(
            f"algorithm.plugins: {_where(path, fn)} returned advantages of shape {tuple(out.advantages.shape)}; "
            f"they must be per token, {tuple(inputs.mask.shape)} like the mask"
        )
    if not bool(torch.isfinite(out.advantages).all()):
        raise PluginError(f"algorithm.plugins: {_where(path, fn)} returned NaN or infinite advantages on a test batch")


def _check_policy_loss(path: Path, name: str) -> None:
    fn = POLICY_LOSSES[name].fn
    required = [p.name for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
    if len(required) > 1:
        raise PluginError(
            f"algorithm.plugins: {_where(path, fn)} must take one argument, a LossInputs record (inputs.logprobs, "
            f"inputs.old_logprobs, inputs.advantages, inputs.mask, ...), then options with defaults; it takes {', '.join(required)}"
        )
    _keyword_defaults(path, fn, 1)
    probe = _probe()
    logprobs = torch.full((4, 3), -1.0, requires_grad=True)
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=torch.full((4, 3), -1.1),
        advantages=torch.ones(4, 3),
        mask=probe.mask,
        ref_logprobs=torch.full((4, 3), -1.2),
        rollout_logprobs=torch.full((4, 3), -1.05),
        entropy=torch.full((4, 3), 0.5),
        horizon=3,
        global_tokens=float(probe.mask.sum()),
        global_sequences=4.0,
    )
    out = _call(path, fn, inputs)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor) and isinstance(out[1], dict)):
        raise PluginError(f"algorithm.plugins: {_where(path, fn)} must return (loss, stats): a scalar tensor and a dict")
    loss = out[0]
    if loss.dim() != 0 or not math.isfinite(float(loss.detach())):
        raise PluginError(f"algorithm.plugins: {_where(path, fn)} must return a finite scalar loss, got shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        raise PluginError(f"algorithm.plugins: {_where(path, fn)} returned a loss without a gradient to the log-probs")


def _check_preset(path: Path, name: str) -> None:
    """A preset names registered entries (the built-ins, or ones its own file or an earlier plug-in registers)."""
    preset = PRESETS[name]
    for what, entry, registry in (
        ("advantage estimator", preset.advantage, ADVANTAGES),
        ("policy loss", preset.policy_loss, POLICY_LOSSES),
        ("step function", preset.step, STEPS),
    ):
        if entry and entry not in registry:
            raise PluginError(f"algorithm.plugins: {path}: preset {name} names the {what} {entry!r}, which is not registered")


def _check_step(path: Path, name: str) -> None:
    """A step runs only inside a job (it drives models and vLLM): its signature is what can be checked here."""
    fn = STEPS[name].fn
    params = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
    if len(params) != 1:
        raise PluginError(
            f"algorithm.plugins: {_where(path, fn)} must take one argument, the StepContext; it takes {len(params)} without defaults"
        )
