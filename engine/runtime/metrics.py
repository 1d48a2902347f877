"""What a run reports: Prometheus gauges on the controller rank, the same numbers in a JSONL log,
a progress bar on the console, and the reward curve as a PNG."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("kuberl.engine")

# name -> (help, key in a step's record)
GAUGES: dict[str, tuple[str, str]] = {
    "kuberl_step": ("RL steps completed", "step"),
    "kuberl_reward_mean": ("Mean reward of the last step's responses", "reward_mean"),
    "kuberl_kl": ("Mean per-token KL to the reference policy in the last step", "kl"),
    "kuberl_policy_loss": ("Policy loss of the last step", "policy_loss"),
    "kuberl_entropy": ("Mean per-token entropy of the policy in the last step", "entropy"),
    "kuberl_response_length_mean": ("Mean response length in tokens in the last step", "response_length_mean"),
    "kuberl_rollout_tokens_per_second": ("Generated tokens per second in the last step's rollout", "rollout_tokens_per_second"),
    "kuberl_rollout_prefix_cache_hit_ratio": (
        "Share of the last rollout's prompt tokens vLLM took from its prefix cache (the controller's replica)",
        "rollout_prefix_cache_hit_ratio",
    ),
    "kuberl_train_tokens_per_second": (
        "Positions the actor's model computed per second of forward and backward in the last step's updates",
        "train_tokens_per_second",
    ),
    "kuberl_train_positions_per_token": (
        "Positions the actor computed per token of its sequences in the last step (above 1: padding; below 1: prompts shared by their samples)",
        "train_positions_per_token",
    ),
    "kuberl_reshard_seconds": ("Seconds of the last training-to-generation switch", "reshard_seconds"),
    "kuberl_switch_bytes": ("Bytes handed to vLLM in the last training-to-generation switch (with LoRA: the adapter's)", "switch_bytes"),
    "kuberl_switch_full_bytes": ("Bytes of the whole model: what a full-weight switch hands vLLM", "switch_full_bytes"),
    "kuberl_switch_back_seconds": (
        "Seconds of the last generation-to-training switch (vLLM sleep, optimizer state back)",
        "switch_back_seconds",
    ),
    "kuberl_switch_hidden_share": ("Share of the last step's switches hidden behind reward scoring", "switch_hidden_share"),
    "kuberl_offloaded_bytes": ("Device bytes the trainers freed for the last rollout (0 on CPU)", "offloaded_bytes"),
    "kuberl_validation_reward_mean": ("Mean reward of greedy responses on the validation set", "validation_reward_mean"),
    # The critic's (ppo); absent from steps that train none.
    "kuberl_critic_vf_clipfrac": (
        "Share of the critic's response tokens in the last step's updates where the clipped value loss "
        "was the larger, so the one taken (verl's vf_clipfrac)",
        "critic/vf_clipfrac",
    ),
    # Separate placement (rollout.placement: separate); absent from colocated jobs' steps.
    "kuberl_staleness": (
        "Policy versions between the trainer and the oldest token of the last step's batch (at most algorithm.async.maxStaleness)",
        "staleness",
    ),
    "kuberl_staleness_mean": (
        "Mean over the last step's response tokens of the policy versions each is behind the trainer",
        "staleness_mean",
    ),
    "kuberl_weight_sync_seconds": (
        "Seconds of the weight syncs to the rollout replicas that finished during the last step (gather, send and load)",
        "weight_sync_seconds",
    ),
    "kuberl_weight_sync_bytes": (
        "Bytes the weight syncs that finished during the last step sent to the rollout replicas",
        "weight_sync_bytes",
    ),
    "kuberl_weight_sync_version": ("The newest policy version the rollout replicas hold", "weight_sync_version"),
    "kuberl_trainer_idle_fraction": (
        "Share of the last step the trainers waited for the rollout fleet's batch",
        "trainer_idle_fraction",
    ),
    "kuberl_rollout_idle_fraction": (
        "Share of the rollout replicas' time spent waiting for a command, from their previous batch to the last step's",
        "rollout_idle_fraction",
    ),
    "kuberl_rollout_queue_depth": (
        "Batches asked of the rollout fleet and not yet trained on, after the last step took its own",
        "rollout_queue_depth",
    ),
    "kuberl_rollout_replica_tokens_per_second_min": (
        "Generated tokens per second of generation of the slowest rollout replica in the last step's batch",
        "rollout_replica_tokens_per_second_min",
    ),
    # Multi-turn rollouts (rollout.multiTurn); absent from one-turn jobs' steps.
    "kuberl_tool_calls": ("Tool calls in the last step's multi-turn rollouts", "multi_turn/tool_calls"),
    "kuberl_tool_errors": (
        "Tool calls in the last step that were answered with an error message (timeouts included)",
        "multi_turn/tool_errors",
    ),
    "kuberl_tool_timeouts": ("Tool calls in the last step that ran past their timeout", "multi_turn/tool_timeouts"),
    "kuberl_tool_seconds_mean": (
        "Mean wall seconds of the last step's tool calls, as the trainer timed them",
        "multi_turn/tool_seconds_mean",
    ),
    "kuberl_tool_seconds_p90": (
        "90th percentile (nearest rank) of the wall seconds of the last step's tool calls",
        "multi_turn/tool_seconds_p90",
    ),
    "kuberl_turns_mean": ("Mean turns of the policy per trajectory in the last step", "multi_turn/turns_mean"),
    "kuberl_policy_token_share": (
        "Share of the last step's trajectory tokens that the policy wrote (the rest, tool results and template tokens, are masked out of the loss)",
        "multi_turn/policy_token_share",
    ),
}
REPLICA_RATE = re.compile(r"rollout_replica/(\d+)/tokens_per_second")
"""A step record's key of one rollout replica's tokens per second (fleet_load.fleet_load_metrics)."""
PHASES = ("reshard", "rollout", "reward", "switch_back", "reference", "values", "advantages", "train", "checkpoint", "validation")


class RunMetrics:
    """Owns its registry (no process-global state); serves /metrics when given a port."""

    def __init__(self, job: str, port: int | None, jsonl: Path | None):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        labels = {"rljob": job}
        self.gauges = {name: Gauge(name, help_, ["rljob"], registry=self.registry).labels(**labels) for name, (help_, _) in GAUGES.items()}
        self.reshard_bytes = Counter(
            "kuberl_reshard_bytes", "Bytes received by the controller rank in weight switches", ["rljob"], registry=self.registry
        ).labels(**labels)
        phase = Gauge("kuberl_phase_seconds", "Seconds the last step spent in each phase", ["rljob", "phase"], registry=self.registry)
        self.phases = {p: phase.labels(rljob=job, phase=p) for p in PHASES}
        self.replica_rate = Gauge(
            "kuberl_rollout_replica_tokens_per_second",
            "Generated tokens per second of generation of each rollout replica in the last step's batch",
            ["rljob", "replica"],
            registry=self.registry,
        )
        self.job = job
        self.jsonl = jsonl
        self.server = None
        if port is not None:
            from prometheus_client import start_http_server

            self.server, _ = start_http_server(port, registry=self.registry)
            log.info("metrics on http://0.0.0.0:%d/metrics", port)
        if jsonl is not None:
            jsonl.parent.mkdir(parents=True, exist_ok=True)

    def record(self, record: Mapping[str, Any]) -> None:
        for name, (_, key) in GAUGES.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.gauges[name].set(value)
        self.reshard_bytes.inc(record.get("reshard_bytes", 0))
        for p, seconds in record.get("phase_seconds", {}).items():
            if p in self.phases:
                self.phases[p].set(seconds)
        for key, value in record.items():
            if (match := REPLICA_RATE.fullmatch(key)) and isinstance(value, (int, float)) and math.isfinite(value):
                self.replica_rate.labels(rljob=self.job, replica=match.group(1)).set(value)
        if self.jsonl is not None:
            with self.jsonl.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_rewards(records: list[dict[str, Any]], out: Path, title: str) -> Path:
    """Reward per step (and greedy validation reward where measured) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["reward_mean"]) for r in records if r.get("reward_mean") is not None]
    if train:
        ax.plot(*zip(*train), label="training reward (sampled)", color="tab:blue", alpha=0.6)
        window = 5
        smooth = [
            sum(v for _, v in train[max(0, i - window + 1) : i + 1]) / len(train[max(0, i - window + 1) : i + 1]) for i in range(len(train))
        ]
        ax.plot([s for s, _ in train], smooth, label=f"training reward ({window}-step mean)", color="tab:blue")
    val = [(r["step"], r["validation_reward_mean"]) for r in records if r.get("validation_reward_mean") is not None]
    if val:
        ax.plot(*zip(*val), "o-", label="validation reward (greedy)", color="tab:orange")
    if not train and not val:
        ax.text(0.5, 0.5, "no reward in these steps (dpo trains on given pairs)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
