"""One rank of a job that runs one real step of each algorithm given, in one process: the models
and vLLM load once, then `RLRun.use_algorithm` switches what the next step runs. Started like
`kuberl run` starts its ranks (RANK, WORLD_SIZE, MASTER_ADDR/PORT, KUBERL_CONFIG); rank 0 writes
one JSON record per step to --out, with the algorithm it ran and whether the actor's weights moved.

multi_turn_steps.py starts its rank and takes its steps with start() and take_steps()."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable


def start() -> tuple[argparse.Namespace, Any, list[Any]]:
    """Read --algorithms and --out, join the job's world and load its run: (arguments, the RLRun, the
    algorithm specs), each spec checked as a job with it would be before it runs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--algorithms", required=True, help="a JSON list of algorithm specs (manifest names)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    logging.basicConfig(level=logging.WARNING)
    import torch

    from kuberl.engine.config.algorithm import AlgorithmSpec
    from kuberl.engine.config.topology import EngineConfig
    from kuberl.engine.distributed.role_worlds import join
    from kuberl.engine.distributed.world import RankEnv, init_model_parallel
    from kuberl.engine.runtime.checks import check_supported
    from kuberl.engine.runtime.rl import RLRun

    torch.set_num_threads(int(os.environ.get("KUBERL_THREADS", "1")))
    env = RankEnv.from_environ()
    config = EngineConfig.model_validate_json(Path(os.environ["KUBERL_CONFIG"]).read_text())
    specs = [AlgorithmSpec.model_validate(raw, by_name=False, by_alias=True) for raw in json.loads(args.algorithms)]
    for spec in specs:  # what a job with this algorithm would be refused for, before it runs
        check_supported(config.model_copy(update={"algorithm": spec}))
    world = join(env, config)
    init_model_parallel(world.block.tp, world.block.pp, config.trainer.seed)
    return args, RLRun(config, world, Path(os.environ["KUBERL_RUN_DIR"])), specs


def take_steps(
    args: argparse.Namespace,
    run: Any,
    specs: list[Any],
    observed: Callable[[], dict[str, Any]] = dict,
    before: Callable[[], None] = lambda: None,
) -> None:
    """One step of each spec; rank 0 writes a record per step to --out, with `observed()`'s entries
    (what the caller saw during the step; `before()` runs ahead of each). Closes the run."""
    import torch

    from kuberl.engine.runtime.rl import Timer

    out = []
    for spec in specs:
        run.use_algorithm(spec)
        before()
        weights = {k: v.clone() for k, v in run.actor.megatron_state().items()}
        timer = Timer()
        record = run.run_step(timer)
        run.step += 1
        moved = any(not torch.equal(weights[k], v) for k, v in run.actor.megatron_state().items())
        out.append({"algorithm": spec.to_manifest(), "moved": moved, "phase_seconds": dict(timer.seconds), **observed(), **record})
    if run.rank == 0:  # the global rank, as RANK
        Path(args.out).write_text("\n".join(json.dumps(r) for r in out))
    run.close()


def main() -> None:
    take_steps(*start())


if __name__ == "__main__":
    main()
