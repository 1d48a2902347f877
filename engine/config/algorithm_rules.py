"""The algorithm section's rules, written over the catalog's traits (algorithm_catalog.py).

A rule says "a preset that trains on preference pairs takes no reward", not "dpo takes no reward":
the names in its CEL and its message are filled in from the registered presets, estimators, losses
and steps, so a new preset with the same traits is held to the same rules without a new line here.
"""

from __future__ import annotations

from typing import Any, Iterable

from . import algorithm_catalog as catalog
from .base import Rule
from .options import option_manifest_name, option_problems

PRESETS = catalog.PRESETS
PAIR_PRESETS = [n for n, p in PRESETS.items() if p.pairs]
REFERENCE_PRESETS = [n for n, p in PRESETS.items() if p.needs_reference]
PAIR_STEPS = sorted(n for n, s in catalog.STEPS.items() if not s.on_policy)
PAIR_LOSSES = sorted(n for n, e in catalog.POLICY_LOSSES.items() if e.pairs)
SELF_CORRECTING_LOSSES = sorted(n for n, e in catalog.POLICY_LOSSES.items() if e.corrects_rollout)
CRITIC_ESTIMATORS = sorted(n for n, e in catalog.ADVANTAGES.items() if e.needs_critic)
GROUP_ESTIMATORS = sorted(n for n, e in catalog.ADVANTAGES.items() if e.min_samples >= 2)
# Presets whose estimator learns a critic, and those that compare several samples of one prompt.
CRITIC_PRESETS = tuple(n for n, p in PRESETS.items() if p.advantage in CRITIC_ESTIMATORS)
GROUP_PRESETS = tuple(n for n, p in PRESETS.items() if p.advantage in GROUP_ESTIMATORS)


def words(names: Iterable[str]) -> str:
    """Names as a message lists them: "a", "a and b", "a, b and c"."""
    names = list(names)
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def cel_in(expr: str, names: Iterable[str]) -> str:
    """CEL: `expr` is one of `names`."""
    return f"{expr} in {sorted(names)!r}".replace('"', "'")


def _by_estimator_cel(algorithm: str, estimators: list[str], presets: Iterable[str]) -> str:
    return f"(has({algorithm}.advantage) ? {cel_in(algorithm + '.advantage.name', estimators)} : {cel_in(algorithm + '.name', presets)})"


def needs_critic_cel(algorithm: str) -> str:
    """CEL over the spec: whether the estimator that runs learns a critic."""
    return _by_estimator_cel(algorithm, CRITIC_ESTIMATORS, CRITIC_PRESETS)


def group_baseline_cel(algorithm: str) -> str:
    """CEL over the spec: whether the estimator that runs compares samples of one prompt."""
    return _by_estimator_cel(algorithm, GROUP_ESTIMATORS, GROUP_PRESETS)


def pairs_cel(algorithm: str) -> str:
    """CEL over the spec: whether the preset trains on preference pairs."""
    return cel_in(f"{algorithm}.name", PAIR_PRESETS)


def group_option_cel(algorithm: str) -> str:
    """CEL over the spec: whether a preset's block asks its estimator to compare a prompt's samples
    (advantage.options are free values CEL cannot read: the parser checks those)."""
    clauses = []
    for name, preset in PRESETS.items():
        estimator = catalog.ADVANTAGES.get(preset.advantage or "")
        if preset.block is None or estimator is None:
            continue
        block = f"{algorithm}.{option_manifest_name(name)}"
        for option, value in estimator.group_options.items():
            field = option_manifest_name(option)
            literal = str(value).lower() if isinstance(value, bool) else repr(value)
            if any(info.alias == field or option_manifest_name(f) == field for f, info in preset.block.model_fields.items()):
                clauses.append(
                    f"({algorithm}.name == '{name}' && !has({algorithm}.advantage) && has({block}) && has({block}.{field})"
                    f" && {block}.{field} == {literal})"
                )
    return "(" + (" || ".join(clauses) or "false") + ")"


def option_rule(entries: dict[str, Any]) -> Rule:
    def problems(s: Any) -> list[str]:
        entry = entries.get(s.name)
        return option_problems(s.options, entry.options, s.name, entry.bounds) if entry is not None else []

    return Rule(
        message="unknown or mistyped option", check=lambda s: not problems(s), field="options", detail=lambda s: "; ".join(problems(s))
    )


def _known_rule(field: str, attr: str, entries: dict[str, Any], what: str) -> Rule:
    names = sorted(entries)
    return Rule(
        message=f"unknown {what}: known are {', '.join(names)} (or register it in a file of algorithm.plugins)",
        check=lambda s: getattr(s, attr) is None or getattr(s, attr).name in entries or bool(s.plugins),
        cel=f"!has(self.{field}) || {cel_in(f'self.{field}.name', names)} || size(self.plugins) > 0",
        field=f"{field}.name",
    )


def _block_rule(preset: str) -> Rule:
    block = option_manifest_name(preset)
    return Rule(
        message=f"{block} applies only to name: {preset}",
        check=lambda s: getattr(s, preset) is None or s.name == preset,
        cel=f"!has(self.{block}) || self.name == '{preset}'",
        field=block,
    )


def _estimator_blocks() -> list[str]:
    """The blocks whose fields are options of their preset's estimator (grpo, reinforcePp)."""
    found = []
    for name, preset in PRESETS.items():
        estimator = catalog.ADVANTAGES.get(preset.advantage or "")
        if (
            preset.block is not None
            and estimator is not None
            and {option_manifest_name(f) for f in preset.block.model_fields} & set(estimator.options)
        ):
            found.append(option_manifest_name(name))
    return found


_PAIRS, _REFERENCE = words(PAIR_PRESETS), words(REFERENCE_PRESETS)
_ESTIMATOR_BLOCKS = _estimator_blocks()

ALGORITHM_RULES = (
    Rule(
        message=f"unknown preset: known are {', '.join(PRESETS)} (or register one in a file of algorithm.plugins)",
        check=lambda s: s.name in PRESETS or bool(s.plugins),
        cel=f"{cel_in('self.name', PRESETS)} || size(self.plugins) > 0",
        field="name",
    ),
    _known_rule("advantage", "advantage", catalog.ADVANTAGES, "advantage estimator"),
    _known_rule("policyLoss", "policy_loss", catalog.POLICY_LOSSES, "policy loss"),
    _known_rule("step", "step", catalog.STEPS, "step function"),
    Rule(
        message=f"the {words(PAIR_STEPS)} step trains on preference pairs: choose it with name: {_PAIRS}",
        check=lambda s: s.step is None or s.step.name not in PAIR_STEPS or s.pairs,
        cel=f"!has(self.step) || !({cel_in('self.step.name', PAIR_STEPS)}) || {pairs_cel('self')}",
        field="step.name",
    ),
    *(_block_rule(name) for name, p in PRESETS.items() if p.block is not None),
    Rule(
        message="tis needs oldLogprobs: recompute (its weight is the trainer's over vLLM's probability of each sampled token)",
        check=lambda s: s.tis is None or s.old_logprobs == "recompute",
        cel="!has(self.tis) || self.oldLogprobs == 'recompute'",
        field="tis",
    ),
    Rule(
        message=f"tis does not apply to a loss that corrects the rollout's tokens itself ({words(SELF_CORRECTING_LOSSES)})",
        check=lambda s: s.tis is None or s.policy_loss is None or s.policy_loss.name not in SELF_CORRECTING_LOSSES,
        cel=f"!has(self.tis) || !has(self.policyLoss) || !({cel_in('self.policyLoss.name', SELF_CORRECTING_LOSSES)})",
        field="tis",
    ),
    Rule(
        message=f"{_PAIRS} has no rollout: oldLogprobs, tis and step do not apply",
        check=lambda s: not s.pairs or (s.old_logprobs == "auto" and s.tis is None and s.step is None),
        cel=f"!({pairs_cel('self')}) || (self.oldLogprobs == 'auto' && !has(self.tis) && !has(self.step))",
        field="name",
    ),
    Rule(
        message="clipRatioHigh must be at least clipRatio",
        check=lambda s: s.clip_ratio_high is None or s.clip_ratio_high >= s.clip_ratio,
        cel="!has(self.clipRatioHigh) || self.clipRatioHigh >= self.clipRatio",
        field="clipRatioHigh",
        detail=lambda s: f"{s.clip_ratio_high} < {s.clip_ratio}",
    ),
    Rule(
        message=f"advantage replaces the preset's estimator: set its options in advantage.options, not in a {words(_ESTIMATOR_BLOCKS)} block",
        check=lambda s: (
            s.advantage is None
            or all(getattr(s, name) is None for name, p in PRESETS.items() if option_manifest_name(name) in _ESTIMATOR_BLOCKS)
        ),
        cel="!has(self.advantage) || (" + " && ".join(f"!has(self.{b})" for b in _ESTIMATOR_BLOCKS) + ")",
        field="advantage",
    ),
    Rule(
        message=f"{_PAIRS} trains on preference pairs: it takes no advantage, and no policyLoss but one over pairs ({words(PAIR_LOSSES)})",
        check=lambda s: (
            not s.pairs or (s.advantage is None and (s.policy_loss is None or s.policy_loss.name in PAIR_LOSSES or bool(s.plugins)))
        ),
        cel=f"!({pairs_cel('self')}) || (!has(self.advantage) && (!has(self.policyLoss) || "
        f"{cel_in('self.policyLoss.name', PAIR_LOSSES)} || size(self.plugins) > 0))",
        field="name",
    ),
    Rule(
        message=f"a loss over preference pairs ({words(PAIR_LOSSES)}) needs a preset that trains on them: name: {_PAIRS}",
        check=lambda s: s.pairs or s.policy_loss is None or s.policy_loss.name not in PAIR_LOSSES,
        cel=f"{pairs_cel('self')} || !has(self.policyLoss) || !({cel_in('self.policyLoss.name', PAIR_LOSSES)})",
        field="policyLoss.name",
    ),
    Rule(
        message="klInReward needs klCoef > 0: there is no KL term to move into the reward",
        check=lambda s: not s.kl_in_reward or s.kl_coef > 0.0,
        cel="!self.klInReward || self.klCoef > 0.0",
        field="klInReward",
    ),
    Rule(
        message=f"{_PAIRS} has no klCoef: its loss's beta is its KL constraint",
        check=lambda s: not s.pairs or s.kl_coef == 0.0,
        cel=f"!({pairs_cel('self')}) || self.klCoef == 0.0",
        field="klCoef",
    ),
)
