"""`kuberl gpu-check`: the engine's GPU path on one GPU, a few minutes: what an image check cannot show.

    kuberl gpu-check                     # on a GPU node, in the GPU trainer image: a random model
                                         # (no download), bf16, every check
    kuberl gpu-check --model DIR         # a Hugging Face Llama-family folder instead
    python bench/gpu_check.py            # the same from a checkout: SmolLM2 when scripts/setup.sh installed it
    kuberl gpu-check --cpu --model DIR   # the same code on CPU in fp32, less the device-memory
                                         # checks (tests/rl/test_gpu_check_on_cpu.py)

The engine's own parts, in a one-rank world as a trainer pod runs them (NCCL on the GPU):
1. vLLM (PyPI's CUDA build on the GPU) samples a group of completions per prompt;
2. the response log-probs of those sequences in the packed, shared-prefix layout (segment attention,
   the default) equal the padded layout's (Megatron's attention), in fp32;
3. the RL loop's MegatronLM (DDP, distributed optimizer) takes a step on packed micro-batches;
4. its weights stream into vLLM, and the greedy completions change;
5. vLLM sleeps and wakes, freeing device memory (GPU only);
6. the optimizer state and gradient buffers leave the device for rollout and come back (GPU: bytes
   freed), and a second step follows.
Prints one JSON object (vLLM prints its own lines before it; --out FILE writes it alone); exit
status 1 if any check fails. The CPU run exists so that this script, which runs only when a GPU is
lent, cannot drift from the engine's API unnoticed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

PROMPT_IDS = [
    [1, 9690, 198, 2683, 314, 216, 33, 34, 1232, 216, 39, 47, 2, 198, 1, 520, 9531, 198],
    [1, 9690, 198, 2683, 314, 216, 36, 1232, 216, 41, 2, 198, 1, 520, 9531, 198],
]
SAMPLES = 4
# fp32 log-probs of two attention implementations: 1e-5 on CPU (tests/rl/test_packing.py); CUDA's
# kernels sum in other orders.
LOGPROB_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kuberl gpu-check", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true", help="run on CPU in fp32, without the device-memory checks")
    parser.add_argument(
        "--model",
        type=Path,
        help="a Hugging Face Llama-family folder (default: SmolLM2-135M-Instruct "
        "where its package is installed, else a random model of about 85M parameters made here)",
    )
    parser.add_argument("--port", type=int, default=29555, help="the one-rank world's TCPStore port")
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")


def run(args: argparse.Namespace) -> int:
    """Every check; exit status 0 when all pass."""
    # torch and vLLM take seconds to import: `kuberl`'s other commands (and the operator's image) never do.
    import torch
    import torch.distributed as dist

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device (run with --cpu for the CPU part)"}))
        return 1
    if device == "cpu":
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # as the worker does on CPU
    else:
        torch.cuda.set_device(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)

    from ..distributed.world import init_model_parallel
    from ..models.arch import LlamaArch
    from ..models.loading import read_hf_config, read_hf_state_dict
    from ..rollout.vllm_backend import VLLMRollout

    init_model_parallel(1, 1, seed=0)
    folder = args.model or default_model()
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    prompts = [[t % arch.vocab_size for t in p] for p in PROMPT_IDS]  # SmolLM2's ids; a small vocabulary wraps them
    state = read_hf_state_dict(folder)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    report: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dtype": str(dtype)}

    started = time.perf_counter()
    rollout = VLLMRollout(
        folder,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
        gpu_memory_utilization=0.3,
        kv_cache_bytes=64 << 20,
        max_model_len=512,
    )
    report["vllm_start_seconds"] = round(time.perf_counter() - started, 1)
    batch = sampled_batch(rollout, prompts, report)

    checks = {"packed_matches_padded": packed_matches_padded(arch, state, batch, report) < LOGPROB_TOLERANCE[device]}
    checks.update(train_switch_and_train_again(arch, state, dtype, batch, prompts, rollout, report, device == "cuda"))
    report["checks"] = checks
    report["ok"] = all(checks.values())
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


def default_model() -> Path:
    """SmolLM2-135M-Instruct from its PyPI package where installed (a checkout); else, as in the trainer image,
    a random Llama-family model large enough that the device-memory checks measure something."""
    import tempfile

    from ..models.loading import gguf_to_hf_folder, smollm2_gguf
    from ..models.tiny import make_tiny_model

    try:
        return gguf_to_hf_folder(smollm2_gguf())
    except FileNotFoundError:
        return make_tiny_model(Path(tempfile.mkdtemp(prefix="kuberl-gpu-check-")) / "model", layers=8, hidden=1024)


def sampled_batch(rollout, prompts: list[list[int]], report: dict):
    """SAMPLES completions of each prompt, as the trainer's packed rows (a group shares its prompt)."""
    from ..rollout.vllm_backend import Sampling
    from ..training.sequences import pack

    started = time.perf_counter()
    completions = rollout.generate(prompts, Sampling(max_new_tokens=24, temperature=1.0, n=SAMPLES))
    report["vllm_sample_seconds"] = round(time.perf_counter() - started, 2)
    report["vllm_generated_tokens"] = sum(len(c.token_ids) for c in completions)
    return pack([prompts[c.prompt_index] for c in completions], [c.token_ids for c in completions], pad_id=0)


def packed_matches_padded(arch, state, batch, report: dict) -> float:
    """The largest difference of a response token's log-prob between the two layouts (fp32)."""
    import torch

    from ..training.policy import MegatronLM

    logprobs = {}
    for name, layout in (("padded", {}), ("packed_shared_prefix", {"packed": True, "share_prefix": True})):
        model = MegatronLM(arch, state, dtype=torch.float32, **layout)
        micro_batches = model.micro_batches(batch, SAMPLES)
        started = time.perf_counter()
        logprobs[name] = torch.cat(model.response_logprobs(micro_batches))
        report[f"{name}_forward_seconds"] = round(time.perf_counter() - started, 3)
        del model
    gap = float(((logprobs["padded"] - logprobs["packed_shared_prefix"]).abs() * batch.mask).max())
    report["packed_vs_padded_max_abs_logprob"] = gap
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return gap


def train_switch_and_train_again(arch, state, dtype, batch, prompts, rollout, report: dict, cuda: bool) -> dict[str, bool]:
    import torch

    from ..config.trainer import OptimizerSpec
    from ..models.convert import megatron_to_hf
    from ..rollout.vllm_backend import Sampling
    from ..training.loss_scale import UpdateTotals
    from ..training.policy import MegatronLM, response_logprobs_from_logits

    def nll(logits, mb, totals: UpdateTotals):
        return -(response_logprobs_from_logits(logits, mb).sum() / totals.tokens), {}

    # A large step, so that one update moves bf16 weights visibly.
    lm = MegatronLM(arch, state, dtype=dtype, optimizer=OptimizerSpec.model_validate({"lr": 1e-3}), packed=True, share_prefix=True)
    micro_batches = lm.micro_batches(batch, SAMPLES)
    first = lm.train_step(micro_batches, nll, 1e-3, UpdateTotals.alone(micro_batches))
    report["train_step_seconds"] = round(first["backward_seconds"] + first["optimizer_seconds"], 3)

    greedy = Sampling(max_new_tokens=32, temperature=0.0)
    before = rollout.generate(prompts, greedy)
    started = time.perf_counter()
    report["update_bytes"] = rollout.update_weights(iter(megatron_to_hf({(0, 0): lm.megatron_state()}, arch).items()))
    report["update_seconds"] = round(time.perf_counter() - started, 3)
    after = rollout.generate(prompts, greedy)
    checks = {"completions_changed": any(a.token_ids != b.token_ids for a, b in zip(after, before))}

    if cuda:  # sleep frees the KV cache (weights at level 1 go to host memory); wake restores them
        free_before, _ = torch.cuda.mem_get_info()
        rollout.sleep()
        free_asleep, _ = torch.cuda.mem_get_info()
        rollout.wake_up()
        report["sleep_freed_gib"] = round((free_asleep - free_before) / 2**30, 2)
        checks["sleep_freed_memory"] = report["sleep_freed_gib"] > 0.5
        checks["same_after_wake"] = [c.token_ids for c in rollout.generate(prompts, greedy)] == [c.token_ids for c in after]

    held = torch.cuda.memory_allocated() if cuda else 0
    report["offload_freed_gib"] = round(lm.offload() / 2**30, 3)
    if cuda:
        report["offload_allocated_gib_before_after"] = [round(held / 2**30, 3), round(torch.cuda.memory_allocated() / 2**30, 3)]
        checks["offload_freed_memory"] = report["offload_freed_gib"] > 0.1
    started = time.perf_counter()
    lm.onload()
    report["onload_seconds"] = round(time.perf_counter() - started, 3)
    second = lm.train_step(micro_batches, nll, 1e-3, UpdateTotals.alone(micro_batches))
    report["grad_norms"] = [round(first["grad_norm"], 4), round(second["grad_norm"], 4)]
    checks["finite_grad_norms"] = all(math.isfinite(g) for g in report["grad_norms"])
    return checks


if __name__ == "__main__":
    sys.exit(main())
