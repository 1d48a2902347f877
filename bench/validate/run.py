"""bench/validate: `kuberl validate` as a whole process, against the floor of any Python validator.

Ours: `kuberl validate FILE` on the main job's manifest, and on a 2 KB alias bomb (30 levels of
9 aliases: 9^30 strings once expanded). The floor, measured in the same run: a Python process that only
imports pydantic and PyYAML, the least any validator built on them costs; its ratio to ours is the
roofline share. The baseline for the bomb is what a plain reader does with it (PyYAML's safe_load,
then json.dumps to send it, as kubectl sends JSON), on a bomb of 7 levels (9^7 strings), since
the 2 KB one would never finish. Each figure is the median of --repeat runs, wall and CPU.

    .venv/bin/python bench/validate/run.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PY = sys.executable
KUBERL = str(Path(PY).parent / "kuberl")


def bomb(levels: int, width: int = 9) -> str:
    rows = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "apiVersion: kuberl.dev/v1alpha1\nkind: RLJob\nmetadata: {name: bomb}\nspec:\n  " + "\n  ".join(rows) + "\n"


def timed(argv: list[str], repeat: int, env: dict[str, str]) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {"wall_s": round(statistics.median(walls), 3), "cpu_s": round(statistics.median(cpus), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    # Bytecode as a user's machine has it: written on the first run, read after.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    work = Path(tempfile.mkdtemp(prefix="kuberl-bench-validate-"))
    big, small = work / "bomb-2kb.yaml", work / "bomb-small.yaml"
    big.write_text(bomb(30))
    small.write_text(bomb(7))
    example = str(REPO / "examples" / "grpo-smollm2-arith.yaml")
    subprocess.run([KUBERL, "validate", example], capture_output=True, env=env, check=True)  # writes the bytecode

    floor = timed([PY, "-c", "import pydantic, yaml"], args.repeat, env)
    ours = timed([KUBERL, "validate", example], args.repeat, env)
    ours_bomb = timed([KUBERL, "validate", str(big)], args.repeat, env)
    naive = "import json, sys, yaml; json.dumps(yaml.safe_load(open(sys.argv[1])))"
    naive_small = timed([PY, "-c", naive, str(small)], max(1, args.repeat // 2), env)
    refused = subprocess.run([KUBERL, "validate", str(big)], capture_output=True, text=True, env=env)

    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "validate_example": ours,
        "floor_import_pydantic_yaml": floor,
        "roofline_share_wall": round(floor["wall_s"] / ours["wall_s"], 2),
        "validate_alias_bomb_2kb": {
            **ours_bomb,
            "bytes": big.stat().st_size,
            "refused": refused.returncode == 1,
            "message": refused.stderr.strip().splitlines()[0] if refused.stderr else "",
        },
        "baseline_safe_load_json_dumps_bomb_9_pow_7": {**naive_small, "bytes": small.stat().st_size},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "validate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
