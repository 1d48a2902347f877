"""The operator: the RLJob API, the control plane that runs it on a cluster, the command line, and the
generators of what is derived from them. Each folder is a layer; a module imports only from its own
folder and from the folders listed before it (tests/test_operator_layers.py).
"""

LAYERS: tuple[tuple[str, str], ...] = (
    ("api", "the RLJob's models, the Kubernetes grammar they use, the generated kube types and the CRD made from them"),
    ("validation", "reading RLJobs from files and the API server, and every rule they are checked by, offline and on the cluster"),
    ("control", "the control plane: the planner and the reconcile decisions (pure), the controller, its caches and the operator process"),
    ("cli", "every `kuberl` and `kubectl rl` verb, `kuberl run` on one machine, the smoke check"),
    ("codegen", "what `make generate` writes: the docs' generated pages, the kube types, the chart's admission policy"),
    ("testing", "the tests' harness (a control plane, a real node, stand-ins): in the checkout only, never in the wheel or an image"),
)
"""Bottom to top. The client (client/) sits between control and cli: it uses the API and the children's labels, and the
command line uses it."""
