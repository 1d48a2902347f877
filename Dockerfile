# The operator image: the control plane only (pydantic, kopf, kubernetes, prometheus-client), no torch.
# Build: docker build -t kuberl-operator:0.1.0 .
# BASE_IMAGE: any image with Python 3.11 and its venv module (scripts/images.sh builds on a Debian 12
# base made locally with mmdebstrap, since no public registry is reachable from the test machines).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PATH=/opt/kuberl/bin:$PATH
# Behind a TLS-inspecting proxy: the path of a CA bundle mounted into the build (scripts/images.sh
# does it); build arguments, so nothing of it stays in the image.
ARG PIP_CERT
ARG SSL_CERT_FILE
RUN python3.11 -m venv /opt/kuberl
WORKDIR /src
COPY pyproject.toml ./
COPY operator ./operator
COPY engine ./engine
# pyproject.toml lists kuberl.client (the job commands' client): the package build needs its folder.
COPY client ./client
# The base install (no extras) is exactly the operator's dependencies.
RUN pip install . && rm -rf /src

# Unprivileged, with a numeric id so that runAsNonRoot can verify it. The passwd entry is needed:
# kopf and torch ask getpass.getuser() for the user's name, which fails for an unknown uid.
RUN echo "kuberl:x:10001:10001:kuberl:/tmp:/usr/sbin/nologin" >> /etc/passwd && echo "kuberl:x:10001:" >> /etc/group
USER 10001:10001
WORKDIR /
ENTRYPOINT ["kuberl"]
CMD ["--help"]
