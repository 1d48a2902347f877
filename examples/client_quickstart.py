"""kuberl.client in a few cells: submit a job, wait for it, read its status and follow its controller rank's log.

Run it as a script or cell by cell in a notebook, with kubectl pointed at a cluster where the kuberl chart is
installed and the README's "Run on your cluster" storage step done (namespace rl, claims rl-work and hub-cache):

    .venv/bin/python examples/client_quickstart.py [MANIFEST] [--namespace rl] [--context CONTEXT]

The same as commands: `kubectl rl submit`, `kubectl rl wait`, `kubectl rl status`, `kubectl rl logs -f` (docs/cli.md).
"""

# %% Connect: your kubeconfig's current context, or the one named; the context's namespace unless one is given.
import argparse
import sys

from kuberl.client import ClientError, PhaseError, RLJobClient

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("manifest", nargs="?", default="examples/grpo-cluster/rljob.yaml")
parser.add_argument("-n", "--namespace", default="rl")
parser.add_argument("--context")
args = parser.parse_args()

try:
    jobs = RLJobClient(context=args.context, namespace=args.namespace)
except ClientError as exc:  # no kubeconfig, no such context: one line says which
    sys.exit(f"error: {exc}")
print(f"cluster {jobs.server}, namespace {jobs.namespace}")

# %% Submit: the manifest is checked first (the API's rules and the cluster's), then created.
# Submitting it again changes nothing; a changed runPolicy (suspend, backoffLimit, deadlines) is applied.
try:
    job = jobs.submit(args.manifest)
except ClientError as exc:  # the CRD missing, RBAC, an invalid manifest, a change a live job cannot take
    sys.exit(f"error: {exc}")
name = job.metadata.name
print(f"submitted {name}")

# %% Where it is: Pending, Initializing (an initializer downloads the model first), Queued, Starting, Running, ...
status = jobs.get(name).status
print(f"{name} is {status.phase if status else 'not yet reconciled'}")

# %% Follow the controller rank (rank 0) as it trains: this waits for its pod to start, and ends when the pod does.
for line in jobs.logs(name, rank=0, follow=True):
    print(line, flush=True)

# %% The end: the status holds the last step's reward, the validation reward, and the checkpoint.
try:
    status = jobs.wait(name, "Succeeded", timeout=600)
except PhaseError as exc:  # ended Failed: the message has the reason (a failed pod, a deadline, ...)
    sys.exit(f"error: {exc}")
print(f"{name}: {status.phase} at step {status.step}/{status.total_steps} ({status.progress}%)")
print(
    f"reward {status.metrics.reward_mean if status.metrics else None}, "
    f"validation reward {status.validation_reward} at step {status.validation_step}"
)
if status.last_checkpoint:
    print(f"last checkpoint: step {status.last_checkpoint.step} at {status.last_checkpoint.path}")
