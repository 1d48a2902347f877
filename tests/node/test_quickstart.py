"""The README's "Run on your cluster", followed as written: every shell block of that section runs, in
order, with bash, against the real node of this suite, so the quickstart cannot rot.

What a user provides, this test provides, and only that: JobSet installed in the cluster (the section's
prerequisite; here built from source and run beside the control plane), and, through the environment
the section names:
REGISTRY (a real registry, distribution's, on the host's end of the node's veth; the node pulls from
it over plain HTTP), HF_ENDPOINT (the tests' stand-in for the Hugging Face hub, serving the real
SmolLM2-135M-Instruct weights under their hub id: the hub cannot be reached from here), KUBECONFIG
and kubectl and helm on PATH, and storage an admin provisioned (volumes the section's claims bind to).
The blocks run in a copy of the repository, as a user's checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kuberl.operator.cli.ports import free_port
from kuberl.operator.testing.cleanup import delete_namespace
from kuberl.operator.testing.waiting import eventually

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent.parent
SECTION = "## Run on your cluster"
TRAINER_UID = 10001
SMOLLM2_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def quickstart_blocks(readme: str) -> list[str]:
    """The ```sh blocks of the README's cluster quickstart, in order."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start : end if end >= 0 else None]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.M | re.S)


def test_the_quickstart_has_its_steps() -> None:
    blocks = quickstart_blocks((REPO / "README.md").read_text())
    text = "\n".join(blocks)
    for step in (
        "make images",
        "make push REGISTRY=$REGISTRY",
        "helm install kuberl dist/kuberl-",
        "examples/grpo-cluster/storage.yaml",
        "kubectl -n rl cp examples/data/arith-train.jsonl",
        "examples/grpo-cluster/rljob.yaml",
        "Succeeded",
        "grpo-smollm2-trained",
    ):
        assert step in text, step


@pytest.fixture(scope="module")
def registry(real_node, tmp_path_factory):
    """distribution's registry on the host's veth address; the node is told it speaks plain HTTP."""
    from kuberl.operator.testing.node_network import HOST_IP

    workdir = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = workdir / "config.yml"
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(workdir / "data")}, "delete": {"enabled": True}},
                "http": {"addr": f"{HOST_IP}:{port}"},
            }
        )
    )
    proc = subprocess.Popen(
        [str(real_node.bin_dir / "registry"), "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "registry.log", "w"),
        start_new_session=True,
    )

    def up() -> bool:
        import urllib.request

        assert proc.poll() is None, (workdir / "registry.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://{HOST_IP}:{port}/v2/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    eventually(up, 60, "the registry")
    real_node.trust_registry(f"{HOST_IP}:{port}")
    yield f"{HOST_IP}:{port}/kuberl"
    proc.terminate()
    proc.wait(timeout=30)
    shutil.rmtree(workdir / "data", ignore_errors=True)  # gigabytes of layers


def checkout(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new files not ignored), in a git work tree
    of their own (`make dist` builds what git tracks or would track)."""
    listed = (
        subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    subprocess.run(["git", "init", "-q", str(dest)], check=True, capture_output=True, timeout=60)
    return dest


def provision(node, host: Path) -> None:
    """What the section assumes of the cluster's storage: volumes its claims (rl/rl-work, rl/hub-cache) bind to."""
    for claim in ("rl-work", "hub-cache"):
        folder = host / claim
        folder.mkdir(parents=True)
        os.chown(folder, TRAINER_UID, TRAINER_UID)
        node.plane.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"quickstart-{claim}"},
                    "spec": {
                        "capacity": {"storage": "20Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "",
                        "persistentVolumeReclaimPolicy": "Delete",
                        "hostPath": {"path": str(folder), "type": "Directory"},
                        "claimRef": {"namespace": "rl", "name": claim},
                    },
                }
            ),
        )


# The user's whole path: images pushed, the chart installed, a model fetched, ten steps trained on the node's CPUs.
@pytest.mark.timeout(1800)
def test_the_readme_cluster_quickstart_runs_as_written(
    real_node, node_schedulers, registry, hub, kube_binaries_dir: Path, tmp_path: Path
) -> None:
    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf

    hub.add_repo(SMOLLM2_REPO, gguf_to_hf_folder(smollm2_gguf()), public=True)  # public on the hub, as SmolLM2 is
    provision(real_node, tmp_path / "storage")
    work = checkout(tmp_path / "kuberl")
    env = {
        **os.environ,
        "REGISTRY": registry,
        "HF_ENDPOINT": hub.url,
        "KUBECONFIG": str(real_node.plane.kubeconfig),
        "PATH": f"{kube_binaries_dir}:{os.environ['PATH']}",
        # The test's registry speaks plain HTTP; uncompressed layers keep the digests the node already has.
        "PUSH_TLS_VERIFY": "false",
        "PUSH_COMPRESS": "0",
    }
    log = tmp_path / "quickstart.log"
    try:
        for i, block in enumerate(quickstart_blocks((REPO / "README.md").read_text())):
            started = time.monotonic()
            with open(log, "a") as out:
                out.write(f"\n--- block {i}\n{block}\n")
                out.flush()
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=2400
                )
            assert result.returncode == 0, f"block {i} failed ({result.returncode}):\n{block}\n{log.read_text()[-5000:]}"
            with open(log, "a") as out:
                out.write(f"--- block {i}: {time.monotonic() - started:.0f} s\n")
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(work / "grpo-smollm2-trained")
        assert model.config.num_hidden_layers == 30  # SmolLM2-135M, trained by the job
        status = json.loads(real_node.plane.kubectl("get", "rlj", "grpo-smollm2", "-n", "rl", "-o", "json").stdout)["status"]
        assert status["phase"] == "Succeeded" and status["step"] == 10
        assert hub.file_fetches(SMOLLM2_REPO) and set(hub.file_fetches(SMOLLM2_REPO).values()) == {1}
        # The pods ran the pushed images, pulled from the registry by their pushed names.
        operator = json.loads(real_node.plane.kubectl("get", "pods", "-n", "kuberl-system", "-o", "json").stdout)["items"]
        assert operator[0]["spec"]["containers"][0]["image"] == f"{registry}/kuberl-operator:0.1.0"
    finally:
        real_node.plane.helm("uninstall", "kuberl", "--namespace", "kuberl-system", "--wait", check=False)
        delete_namespace(real_node.plane, "rl")
