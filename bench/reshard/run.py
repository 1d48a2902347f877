"""bench/reshard: the hybrid engine's training->generation switch against a naive all-gather, in one run.

On 4 CPU ranks (gloo), for SmolLM2-135M in the layout (t=1, p=2, d=2) with one vLLM replica per
rank (t_g = 1; its 3 key/value heads rule out t=2 and its 30 layers p=4), and for a larger synthetic
Llama in (t=2, p=1, d=2) and (t=2, p=2, d=1), each with t_g = 1 and with two-rank vLLM replicas
(t_g = 2, each rank gathering only its generation shard):
- ours: the Resharder (each piece sent once by its holder inside the model-parallel group,
  bucketed, converted to Hugging Face tensors as it arrives);
- baseline: DeepSpeed-Chat style, every rank all-gathers every rank's shard across the world;
- the formula: HybridFlow's (tp - t_g p_g)/(t_g p_g tp) * M.
Reported per layout: bytes received per rank (max over ranks) and seconds (max over ranks, median
of 3 switches), and the time ratio naive / ours.

    .venv/bin/python bench/reshard/run.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

RESULTS = Path(__file__).resolve().parents[1] / "results"
SYNTHETIC = dict(
    model_type="llama",
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
REPEATS = 3


def worker(args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    from kuberl.engine.compat import megatron_cpu

    megatron_cpu.apply()
    from megatron.core import parallel_state as ps

    from kuberl.engine.hybrid.baseline import naive_all_gather
    from kuberl.engine.hybrid.reshard import Resharder
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.convert import hf_to_megatron

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    config = json.loads(Path(args.config).read_text())
    arch = LlamaArch.from_hf_config(config)
    stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    full = load_or_make(args, config)
    model_bytes = sum(t.numel() for t in full.values()) * 4
    local = hf_to_megatron(full, arch, tp_rank, args.tp, stage, args.pp)
    del full  # four ranks share 24 GiB: keep only this rank's shard
    group = ps.get_model_parallel_group()
    members = [None] * dist.get_world_size(group)
    dist.all_gather_object(members, (stage, tp_rank, args.rank), group=group)
    resharder = Resharder(arch, args.tp, args.pp, stage, tp_rank, {(s, t): r for s, t, r in members}, group, tg=args.tg)
    ours, naive = [], []
    for _ in range(REPEATS):
        dist.barrier()
        for _name, _tensor in resharder.stream(local):
            pass  # a consumer takes each tensor as it arrives (vLLM's reload in the engine)
        ours.append(resharder.stats.seconds)
        dist.barrier()
        started = time.perf_counter()
        naive_bytes = naive_all_gather(local, args.world)
        naive.append(time.perf_counter() - started)
    report = {
        "rank": args.rank,
        "ours_bytes": resharder.stats.bytes_received,
        "ours_seconds": statistics.median(ours),
        "naive_bytes": naive_bytes,
        "naive_seconds": statistics.median(naive),
        "model_bytes": model_bytes,
    }
    Path(f"{args.out}.{args.rank}").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def load_or_make(args: argparse.Namespace, config: dict) -> dict[str, torch.Tensor]:
    if args.weights:
        from kuberl.engine.models.loading import read_hf_state_dict

        return read_hf_state_dict(Path(args.weights))
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in transformers.LlamaForCausalLM(cfg).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=generator) * 0.02 for k, s in shapes.items()}


def run_case(name: str, config: dict, weights: str | None, tp: int, pp: int, tg: int, workdir: Path) -> dict:
    from kuberl.engine.hybrid.plan import hybridflow_bytes, transfer_units
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.operator.cli.ports import free_port

    config_path = workdir / f"{name}.json"
    config_path.write_text(json.dumps(config))
    port = free_port()
    out = workdir / f"{name}-t{tp}p{pp}g{tg}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                "--rank",
                str(r),
                "--world",
                "4",
                "--port",
                str(port),
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                "--tg",
                str(tg),
                "--config",
                str(config_path),
                "--out",
                str(out),
                *(["--weights", weights] if weights else []),
            ]
        )
        for r in range(4)
    ]
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"a rank of {name} t={tp} p={pp} t_g={tg} failed")
    reports = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(4)]
    units = transfer_units(LlamaArch.from_hf_config(config), tp, pp)
    sharded = sum(p.numel() for u in units for p in u.pieces if p.tp_rank is not None) * 4
    ours_s, naive_s = max(r["ours_seconds"] for r in reports), max(r["naive_seconds"] for r in reports)
    return {
        "model": name,
        "layout": f"t={tp} p={pp} d={4 // (tp * pp)}, t_g={tg}",
        "model_bytes": reports[0]["model_bytes"],
        "formula_bytes_per_rank": round(hybridflow_bytes(sharded, tp * pp, tg=tg)),
        "ours_bytes_per_rank_max": max(r["ours_bytes"] for r in reports),
        "ours_bytes_per_rank_mean": round(statistics.mean(r["ours_bytes"] for r in reports)),
        "naive_bytes_per_rank_max": max(r["naive_bytes"] for r in reports),
        "ours_seconds": round(ours_s, 3),
        "naive_seconds": round(naive_s, 3),
        "time_ratio_naive_over_ours": round(naive_s / max(ours_s, 1e-6), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    for flag in ("--rank", "--world", "--port", "--tp", "--pp", "--tg"):
        parser.add_argument(flag, type=int, default=1)
    parser.add_argument("--config")
    parser.add_argument("--weights")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from kuberl.engine.models.loading import gguf_to_hf_folder, read_hf_config, smollm2_gguf

    smol = gguf_to_hf_folder(smollm2_gguf())
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-bench-reshard-"))
    rows = []
    cases = (
        ("SmolLM2-135M", read_hf_config(smol), str(smol), ((1, 2, 1),)),
        ("synthetic-Llama-200M", SYNTHETIC, None, ((2, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2))),
    )
    for name, config, weights, layouts in cases:
        for tp, pp, tg in layouts:
            rows.append(run_case(name, config, weights, tp, pp, tg, workdir))
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "benchmark": "reshard",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, 4 gloo ranks, 1 thread each",
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reshard.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
