"""`kuberl worker`: what one rank of a job runs, in a pod or under `kuberl run`.

Reads the engine config (KUBERL_CONFIG) and the rank's place (torchrun's variables), joins the
world, runs the job to its end, and exits 0. A failure is logged with the rank and role, and written
to the container's termination message (config/termination.py); the rank exits 3 when a restart
cannot change its cause (the job's configuration, its model, its user code, a refused checkpoint), so
the job fails at once, and 1 otherwise, so the gang restarts. SIGTERM or SIGINT stops the job at the
next step boundary with a checkpoint, and the rank exits 128 + the signal (stopping.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Mapping

log = logging.getLogger("kuberl.engine")


def collective_timeout_s(environ: Mapping[str, str], job_s: int) -> int:
    """The job's trainer.collectiveTimeoutSeconds, unless KUBERL_TIMEOUT_S (`kuberl run --timeout`) says otherwise."""
    raw = environ.get("KUBERL_TIMEOUT_S")
    return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else job_s


def report_failure(exc: BaseException, role: str, rank: int) -> int:
    """Write why this rank failed to the termination log (for the operator); the exit code that says
    whether a restart could help."""
    from ..common.termination_log import write_termination_message
    from ..config.termination import exit_code_of, failure_of

    failure = failure_of(exc, role, rank)
    write_termination_message(failure.to_json())
    if not failure.retryable:
        log.error("rank %d (role %s): %s; not retried: a restart would fail the same way", rank, role, failure.reason)
    return exit_code_of(failure)


def _threads(environ) -> int:
    if "KUBERL_THREADS" in environ:
        return max(1, int(environ["KUBERL_THREADS"]))
    return max(1, (os.cpu_count() or 1) // max(1, int(environ.get("KUBERL_LOCAL_WORLD", "1"))))


def spawn_local_ranks(count: int) -> int:
    """A pod with several GPUs runs one process per GPU (LOCAL_RANK 0..count-1), as torchrun would;
    the first to fail stops the others and decides the pod's exit status."""
    import subprocess

    from .processes import forward_stop_signals, stop, wait_for_gang

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kuberl.engine.runtime.worker"],
            env={**os.environ, "LOCAL_RANK": str(i), "KUBERL_LOCAL_WORLD": str(count)},
        )
        for i in range(count)
    ]
    # Kubernetes signals only the container's first process: each rank must hear it.
    received = forward_stop_signals(procs)
    try:
        cause, codes = wait_for_gang(procs, stopping=lambda: bool(received))
    finally:
        stop(procs, grace_s=30)
    return 0 if cause is None else codes[cause]


def main(argv: list[str] | None = None) -> int:
    import faulthandler
    import signal

    from ..distributed.world import RankEnv, WorldError

    # `kill -USR1 <pid>` prints where a rank is (a rank that waits on a peer, for one).
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    per_pod = int(os.environ.get("KUBERL_PROCS_PER_POD", "1") or 1)
    if per_pod > 1 and "LOCAL_RANK" not in os.environ and "RANK" not in os.environ:
        return spawn_local_ranks(per_pod)

    from .stopping import StopRequest

    # From here on SIGTERM and SIGINT mean: stop at the next step boundary, with a checkpoint.
    stop = StopRequest().install()
    try:
        env = RankEnv.from_environ()
    except WorldError as exc:
        print(f"kuberl worker: {exc}", file=sys.stderr)
        return report_failure(exc, os.environ.get("KUBERL_ROLE", "?")[:16], 0)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {env.rank} [{env.role}] %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    for noisy in ("vllm", "transformers", "megatron", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import warnings

    # Megatron and vLLM warn at import about optional CUDA kernels a CPU run never uses.
    for module in ("megatron", "vllm", "torch.distributed"):
        warnings.filterwarnings("ignore", category=UserWarning, module=module)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if not os.path.exists("/dev/nvidiactl"):
        # On CPU, vLLM's sampler asks torch.compile for kernels whose generated C++ fails to build
        # with some toolchains (at::vec missing); eager mode is what the CPU path needs anyway.
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    config_path = os.environ.get("KUBERL_CONFIG")
    if not config_path:
        from ..runtime.algorithm_checks import ConfigError

        return report_failure(
            ConfigError("KUBERL_CONFIG is not set: it names the engine config (JSON) that the operator or `kuberl run` renders"),
            env.role,
            env.rank,
        )

    import torch

    from ..config.topology import EngineConfig
    from ..distributed.role_worlds import join
    from ..distributed.world import init_model_parallel

    torch.set_num_threads(_threads(os.environ))
    try:
        config = EngineConfig.model_validate_json(Path(config_path).read_text())
    except Exception as exc:
        from ..runtime.algorithm_checks import ConfigError

        log.error("cannot read the engine config %s: %s", config_path, exc)
        return report_failure(ConfigError(f"cannot read the engine config {config_path}: {exc}"), env.role, env.rank)
    env = dataclasses.replace(env, timeout_s=collective_timeout_s(os.environ, config.trainer.collective_timeout_seconds))
    run_dir = Path(os.environ.get("KUBERL_RUN_DIR", config.trainer.checkpoint.path)).expanduser()
    run = None
    try:
        from .rl import RLRun, check_supported

        check_supported(config)  # before any rank waits for another: every rank refuses the same job alike
        world = join(env, config)
        init_model_parallel(world.block.tp, world.block.pp, config.trainer.seed, world.block.ep)
        if world.role == "actor":
            run = RLRun(config, world, run_dir)
            report = _reporter(run, env.rank == 0)
            last = run.run(progress=report, stop=stop)
            completed = not run.stopped
            if env.rank == 0 and completed:
                _summary(run, last)
        elif world.role == "rollout":
            from .rollout_worker import RolloutWorker

            completed = RolloutWorker(config, world).serve(stop)
        else:
            from .role_worker import RoleWorker

            completed = RoleWorker(config, world).serve(stop)
        import torch.distributed as dist

        from ..distributed.role_worlds import leave

        dist.barrier()
        leave(world)
        if not completed:
            log.info("rank %d (role %s) stopped at a step boundary on request; exit %d", env.rank, env.role, stop.exit_code())
            return stop.exit_code()
        return 0
    except Exception as exc:
        log.error("rank %d (role %s) failed: %s: %s", env.rank, env.role, type(exc).__name__, exc)
        log.debug("%s", traceback.format_exc())
        if not isinstance(exc, (ValueError, FileNotFoundError)):
            traceback.print_exc()
        return report_failure(exc, env.role, env.rank)
    finally:
        if run is not None:
            run.close()


def _reporter(run, controller: bool):
    if not controller:
        return None
    from tqdm import tqdm

    from .progress import ProgressTracker, ProgressWriter

    writer = ProgressWriter()
    tracker = ProgressTracker(run.total_steps)
    bar = tqdm(total=run.total_steps, initial=run.step, desc=run.config.job, unit="step", dynamic_ncols=True, file=sys.stderr)

    def report(record: dict) -> None:
        bar.update(1)
        # What the step reports: a reward when it scores responses, DPO's preference accuracy when it trains on pairs.
        shown = {"reward": "reward_mean", "accuracy": "reward_accuracy", "loss": "dpo_loss"}
        postfix = {name: f"{record[key]:.3f}" for name, key in shown.items() if record.get(key) is not None}
        if "rollout_tokens_per_second" in record:
            postfix["tok/s"] = f"{record['rollout_tokens_per_second']:.0f}"
        if "validation_reward_mean" in record:
            postfix["val"] = f"{record['validation_reward_mean']:.3f}"
        bar.set_postfix(postfix)
        writer.write(tracker.report(record, run.last_checkpoint))
        if "validation_reward_mean" in record or record["step"] == run.total_steps:
            bar.write(
                f"step {record['step']}: "
                + ", ".join(f"{k} {v:.4g}" for k, v in sorted(record.items()) if isinstance(v, float) and "/" not in k)
            )

    return report


def _summary(run, last: dict) -> None:
    share = run.reshard_total["seconds"] / max(run.reshard_total["step_seconds"], 1e-9)
    log.info("done: %d steps; switch took %.1f%% of step time; metrics in %s", run.step, 100 * share, run.run_dir / "metrics.jsonl")


if __name__ == "__main__":
    sys.exit(main())
