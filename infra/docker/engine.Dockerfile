# syntax=docker/dockerfile:1.7
# The engine image: `loraplex engine` on an NVIDIA CUDA runtime with the torch build for the
# same CUDA (the base image's CUDA and TORCH_INDEX change together), plus what the engine
# compiles at run time: Triton builds a C launcher against Python.h at a kernel's first launch
# and our CPU kernels are C built with `cc`, so the serving stage has gcc, libc6-dev and
# python3-dev, and the build fails unless engine_check.py compiles both. Build from the
# repository root, for the nodes' architecture:
#   docker build --platform linux/amd64 -f infra/docker/engine.Dockerfile -t loraplex-engine:TAG .
# checkov:skip=CKV_DOCKER_2:Kubernetes probes (infra/k8s) check health; Docker's HEALTHCHECK is ignored there.

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/loraplex/bin:$PATH
# Ubuntu's python3.12 moves with security updates; the base image's tag pins the rest.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/loraplex
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY platform platform
COPY adapters adapters
COPY moe moe
COPY loader loader
COPY api api
COPY migrations migrations
COPY infra/__init__.py infra/__init__.py
COPY infra/k8s infra/k8s
RUN pip install --no-cache-dir . \
    && python -c "import loraplex.platform.engine.server, loraplex.platform.gateway.replica_agent"

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 loraplex \
    && useradd --system --uid 10001 --gid loraplex --create-home --home-dir /home/loraplex loraplex
COPY --from=build /opt/loraplex /opt/loraplex
COPY infra/docker/engine_check.py /opt/loraplex/engine_check.py
ENV PATH=/opt/loraplex/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python /opt/loraplex/engine_check.py
USER 10001:10001
WORKDIR /home/loraplex
EXPOSE 8100
# The deployment's engine options come from Kubernetes (infra/k8s/templates/engine.yaml.j2).
CMD ["loraplex", "engine", "--help"]
