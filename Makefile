# kuberl's developer commands. `make setup` and `make test` are the two that work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(HOME)/.cache/kuberl/tools/uv-0.13.8/bin/uv

.PHONY: setup kube-binaries scheduling-binaries agent-sandbox-binaries node-deps node-binaries images push prometheus test crd generate lock main-job agent-demo bench-setup dist docs

setup:  ## make .venv with everything kuberl needs (idempotent, ~1 s when up to date)
	bash scripts/setup.sh

kube-binaries: node-deps  ## build (once) and cache the Kubernetes binaries of the cluster and real-node tests
	bash scripts/kube-binaries.sh >/dev/null

scheduling-binaries:  ## build (once) and cache Kueue and JobSet (their managers, CRDs and webhooks) for the cluster tests
	bash scripts/scheduling-binaries.sh >/dev/null

agent-sandbox-binaries:  ## build (once) and cache the kubernetes-sigs agent-sandbox controller and its CRDs for the cluster tests
	bash scripts/agent-sandbox-binaries.sh >/dev/null

node-deps:  ## Debian's packages of the real-node and docs tests (CNI plugins, iptables, buildah, mmdebstrap, compilers, chromium); needs root
	bash scripts/node-deps.sh

node-binaries: node-deps  ## build (once) and cache containerd, runc and CoreDNS for the real-node tests
	bash scripts/node-binaries.sh >/dev/null

images: node-deps kube-binaries  ## build the operator, CPU trainer and GPU trainer images with buildah (cached by a hash of their inputs; KUBERL_GPU_IMAGE=0: no GPU trainer)
	bash scripts/images.sh

push: images  ## push the images to $(REGISTRY) as kuberl-operator:VERSION and kuberl-trainer:VERSION-cpu (GPU=1: also the GPU kuberl-trainer:VERSION)
	@test -n "$(REGISTRY)" || { echo "make push needs REGISTRY, e.g. make push REGISTRY=registry.example.com/my-team" >&2; exit 2; }
	PUSH_GPU=$(if $(filter 1,$(GPU)),1,0) bash scripts/push-images.sh $(REGISTRY)

prometheus:  ## Debian's prometheus and promtool, unpacked once into ~/.cache/kuberl (the monitoring tests use them)
	@# Not fatal here: without it the monitoring tests fail with the reason, and every other test still runs.
	-bash scripts/prometheus.sh >/dev/null

test: setup node-deps kube-binaries scheduling-binaries agent-sandbox-binaries node-binaries prometheus  ## run the test suite
	@# The images are built here, not in a test fixture: a cold build takes longer than one test's timeout.
	bash scripts/images.sh >/dev/null
	$(VENV)/bin/pytest

crd: setup  ## regenerate crds/ and the chart's admission policy rules from the API models
	$(VENV)/bin/kuberl crd > crds/kuberl.dev_rljobs.yaml
	cp crds/kuberl.dev_rljobs.yaml helm/kuberl/crds/kuberl.dev_rljobs.yaml
	$(VENV)/bin/python -m kuberl.operator.codegen.admission_policy > helm/kuberl/files/admission-policy.json

generate: setup  ## regenerate everything made from the code (docs/testing.md lists it); a tree that is current stays unchanged
	@# Each to a temporary file first: the generators import the package whose file they rewrite.
	$(PY) -m kuberl.operator.codegen.kube_types > operator/api/kube_types.py.new && mv operator/api/kube_types.py.new operator/api/kube_types.py
	$(PY) -m kuberl.engine.runtime.catalog > engine/config/algorithm_catalog.py.new && mv engine/config/algorithm_catalog.py.new engine/config/algorithm_catalog.py
	$(MAKE) --no-print-directory crd
	$(PY) -m kuberl.operator.codegen.docgen docs

docs: setup  ## regenerate the docs' generated pages and build the site into site/ (mkdocs build --strict)
	bash scripts/docs.sh site

lock: setup  ## re-resolve requirements/cpu.lock and gpu.lock after a change to pyproject.toml's dependencies
	$(UV) pip compile pyproject.toml --extra cpu --extra engine --extra test --extra tracking --extra docs \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header -o requirements/cpu.lock
	$(UV) pip compile pyproject.toml --extra gpu --extra tracking \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header -o requirements/gpu.lock

main-job: setup  ## the README's main job: GRPO on SmolLM2-135M on CPU (about 3.5 minutes on 2 cores)
	$(VENV)/bin/kuberl run examples/grpo-smollm2-arith.yaml

agent-demo: setup  ## the agentic demo: SmolLM2-135M learns to call a calculator (accuracy before/after, with and without it; docs/agents.md)
	$(PY) bench/agent/run.py

bench-setup: setup  ## what bench/grpo needs besides .venv: TRL (its baseline), within the lock's versions
	$(UV) pip install --quiet --python $(PY) --constraint requirements/cpu.lock trl==1.16.0 datasets==5.2.0

dist:  ## wheel, sdist, Helm chart and image archives in dist/ with SHA256SUMS (BUILDER=docker|podman|buildah: images with it; DIST_IMAGES=0: none)
	DIST_IMAGES=$(DIST_IMAGES) bash scripts/dist.sh dist
