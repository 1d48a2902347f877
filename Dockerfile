# The operator image: the control plane only (pydantic, kopf, kubernetes, prometheus-client), no torch.
# Build: docker build -t kuberl-operator:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY engine ./engine
# The base install (no extras) is exactly the operator's dependencies.
RUN pip install . && rm -rf /src

# Runs as an unprivileged user with a numeric id, so runAsNonRoot can verify it.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin kuberl
USER 10001
WORKDIR /
ENTRYPOINT ["kuberl"]
CMD ["--help"]
