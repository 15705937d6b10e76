# syntax=docker/dockerfile:1
# The one headstart image: gateway, engine (Ray head and workers), table-cache
# service and its registration Job all run from it (the chart picks the command).
#
#   docker build --build-context shared=../shared -t REGISTRY/headstart:0.1.0 .                               # CPU
#   docker build --build-context shared=../shared --build-arg VARIANT=cuda -t REGISTRY/headstart:0.1.0-cuda .  # CUDA
#
# `--build-context shared=../shared` puts the read-only data folder beside the checkout
# (the Qwen2.5 tokenizer, the Spider databases) at /shared, where headstart looks for it
# (beside /app): the chart's default install then serves the Spider databases. Without
# it /shared is empty (the `shared` stage below) and only a catalogue you mount is served.
#
# The CUDA variant differs only in the torch wheel: PyTorch's CUDA wheels carry
# the CUDA runtime as pip packages, so the base image stays python:slim and the
# node's NVIDIA driver (device plugin / container toolkit) does the rest.
ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS torch-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS torch-cuda
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

# Replaced by `--build-context shared=DIR` when given (a named context overrides a stage of its name).
FROM scratch AS shared

# -- build: a virtualenv with torch (pinned, as run.sh) and headstart ------------
# hadolint ignore=DL3006
FROM torch-${VARIANT} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir "torch==2.13.0" --index-url "${TORCH_INDEX_URL}"
WORKDIR /app
# dependencies first: a code change does not reinstall them
COPY pyproject.toml README.md ./
COPY shared/headstart/__init__.py shared/headstart/__init__.py
COPY services/__init__.py services/__init__.py
COPY bench/__init__.py bench/__init__.py
COPY loadtest/__init__.py loadtest/__init__.py
COPY cli/__init__.py cli/__init__.py
RUN pip install --no-cache-dir -e .
COPY shared/headstart shared/headstart
COPY services services
COPY bench bench
# the `headstart` command the install above put on PATH (cli/), and loadtest/, which it imports
COPY loadtest loadtest
COPY cli cli
COPY deploy/helm deploy/helm

# -- runtime: the venv and the code, a non-root user, nothing else -------------
FROM ${PYTHON_IMAGE} AS runtime
# wget: KubeRay's probes of Ray pods call it. g++: the engine builds its native
# decode kernels (kernels/native.cpp) for the node's own CPU at start;
# without it HEADSTART_FAST_PATH=native falls back to oneDNN and says why.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget=1.21.* g++=4:12.2.* \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 headstart \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/headstart headstart
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY --from=shared / /shared/
WORKDIR /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app/shared:/app \
    HEADSTART_HOME=/tmp/headstart \
    HF_HOME=/cache/huggingface \
    RAY_USAGE_STATS_ENABLED=0
USER 10001:10001
EXPOSE 8080 50051 50061 9000
CMD ["python", "-m", "services.gateway"]
