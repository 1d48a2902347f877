"""The GPU check for a lent machine (one prepared run, a few minutes): what CPU tests cannot show.

    python bench/gpu_check.py                        # on the GPU: SmolLM2 in bf16, every check
    python bench/gpu_check.py --cpu --model DIR      # the same code on CPU in fp32, less the
                                                     # device-memory checks (tests/rl/test_gpu_check_on_cpu.py)

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

import torch
import torch.distributed as dist

PROMPT_IDS = [[1, 9690, 198, 2683, 314, 216, 33, 34, 1232, 216, 39, 47, 2, 198, 1, 520, 9531, 198],
              [1, 9690, 198, 2683, 314, 216, 36, 1232, 216, 41, 2, 198, 1, 520, 9531, 198]]
SAMPLES = 4
# fp32 log-probs of two attention implementations: 1e-5 on CPU (tests/rl/test_packing.py); CUDA's
# kernels sum in other orders.
LOGPROB_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU in fp32, without the device-memory checks")
    parser.add_argument("--model", type=Path, help="a Hugging Face Llama folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--port", type=int, default=29555, help="the one-rank world's TCPStore port")
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
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

    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import (
        gguf_to_hf_folder,
        read_hf_config,
        read_hf_state_dict,
        smollm2_gguf,
    )
    from kuberl.engine.rollout.vllm_backend import VLLMRollout
    from kuberl.engine.distributed.world import init_model_parallel

    init_model_parallel(1, 1, seed=0)
    folder = args.model or gguf_to_hf_folder(smollm2_gguf())
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    state = read_hf_state_dict(folder)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    report: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dtype": str(dtype)}

    started = time.perf_counter()
    rollout = VLLMRollout(folder, dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                          gpu_memory_utilization=0.3, kv_cache_bytes=64 << 20, max_model_len=512)
    report["vllm_start_seconds"] = round(time.perf_counter() - started, 1)
    batch = sampled_batch(rollout, report)

    checks = {"packed_matches_padded": packed_matches_padded(arch, state, batch, report) < LOGPROB_TOLERANCE[device]}
    checks.update(train_switch_and_train_again(arch, state, dtype, batch, rollout, report, device == "cuda"))
    report["checks"] = checks
    report["ok"] = all(checks.values())
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


def sampled_batch(rollout, report: dict):
    """SAMPLES completions of each prompt, as the trainer's packed rows (a group shares its prompt)."""
    from kuberl.engine.rollout.vllm_backend import Sampling
    from kuberl.engine.training.sequences import pack

    started = time.perf_counter()
    completions = rollout.generate(PROMPT_IDS, Sampling(max_new_tokens=24, temperature=1.0, n=SAMPLES))
    report["vllm_sample_seconds"] = round(time.perf_counter() - started, 2)
    report["vllm_generated_tokens"] = sum(len(c.token_ids) for c in completions)
    return pack([PROMPT_IDS[c.prompt_index] for c in completions], [c.token_ids for c in completions], pad_id=0)


def packed_matches_padded(arch, state, batch, report: dict) -> float:
    """The largest difference of a response token's log-prob between the two layouts (fp32)."""
    from kuberl.engine.training.policy import MegatronLM

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


def train_switch_and_train_again(arch, state, dtype, batch, rollout, report: dict, cuda: bool) -> dict[str, bool]:
    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.models.convert import megatron_to_hf
    from kuberl.engine.rollout.vllm_backend import Sampling
    from kuberl.engine.training.loss_scale import UpdateTotals
    from kuberl.engine.training.policy import MegatronLM, response_logprobs_from_logits

    def nll(logits, mb, totals: UpdateTotals):
        return -(response_logprobs_from_logits(logits, mb).sum() / totals.tokens), {}

    # A large step, so that one update moves bf16 weights visibly.
    lm = MegatronLM(arch, state, dtype=dtype, optimizer=OptimizerSpec.model_validate({"lr": 1e-3}),
                    packed=True, share_prefix=True)
    micro_batches = lm.micro_batches(batch, SAMPLES)
    first = lm.train_step(micro_batches, nll, 1e-3, UpdateTotals.alone(micro_batches))
    report["train_step_seconds"] = round(first["backward_seconds"] + first["optimizer_seconds"], 3)

    greedy = Sampling(max_new_tokens=32, temperature=0.0)
    before = rollout.generate(PROMPT_IDS, greedy)
    started = time.perf_counter()
    report["update_bytes"] = rollout.update_weights(iter(megatron_to_hf({(0, 0): lm.megatron_state()}, arch).items()))
    report["update_seconds"] = round(time.perf_counter() - started, 3)
    after = rollout.generate(PROMPT_IDS, greedy)
    checks = {"completions_changed": any(a.token_ids != b.token_ids for a, b in zip(after, before))}

    if cuda:  # sleep frees the KV cache (weights at level 1 go to host memory); wake restores them
        free_before, _ = torch.cuda.mem_get_info()
        rollout.sleep()
        free_asleep, _ = torch.cuda.mem_get_info()
        rollout.wake_up()
        report["sleep_freed_gib"] = round((free_asleep - free_before) / 2**30, 2)
        checks["sleep_freed_memory"] = report["sleep_freed_gib"] > 0.5
        checks["same_after_wake"] = [c.token_ids for c in rollout.generate(PROMPT_IDS, greedy)] == [c.token_ids for c in after]

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
