# syntax=docker/dockerfile:1.7
# The platform image: api (REST API, OpenAI gateway, console), worker, migrations, the replica
# agent. Slim Python with the CPU build of torch (a package dependency the gateway never
# imports). Build from the repository root:
#   docker build --platform linux/amd64 -f infra/docker/platform.Dockerfile -t loraplex-platform:TAG .
# checkov:skip=CKV_DOCKER_2:Kubernetes probes (infra/k8s) check health; Docker's HEALTHCHECK is ignored there.

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/loraplex/bin:$PATH
RUN python -m venv /opt/loraplex
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
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
# The platform image never carries CUDA: the build fails if anything brought it in.
RUN pip install --no-cache-dir "./[kubernetes]" \
    && python -c "import loraplex.api.app, loraplex.platform.db.migrate, loraplex.platform.launcher.k8s" \
    && python -c "import importlib.metadata as m, torch; assert torch.version.cuda is None, torch.version.cuda; bad = [d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].lower().startswith(('nvidia-', 'triton'))]; assert not bad, bad"

FROM python:3.11.11-slim-bookworm
RUN groupadd --system --gid 10001 loraplex \
    && useradd --system --uid 10001 --gid loraplex --create-home --home-dir /home/loraplex loraplex
COPY --from=build /opt/loraplex /opt/loraplex
ENV PATH=/opt/loraplex/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/loraplex
EXPOSE 8000
CMD ["loraplex", "api"]
