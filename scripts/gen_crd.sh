#!/usr/bin/env bash
# Regenerates the Helm chart's copy of the RLJob CRD from the operator's pydantic models
# (scalerl_operator.api.crd). `--check` only compares and exits 1 when the committed copy is stale.
#   bash scripts/gen_crd.sh            # or: make crd
#   bash scripts/gen_crd.sh --check
set -euo pipefail
cd "$(dirname "$0")/.."
out=helm/scalerl/files/rljob-crd.yaml
# the project's environment when there is one (make install-dev), else whatever python3 is
if [ -z "${PY:-}" ] && [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=${PY:-python3}; fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$py" -m scalerl_operator.api.crd > "$tmp"
case "${1:-}" in
  --check)
    if cmp -s "$tmp" "$out"; then
      echo "$out: current"
    else
      echo "$out: stale or missing; run: bash scripts/gen_crd.sh" >&2
      exit 1
    fi ;;
  "")
    mv "$tmp" "$out"
    chmod 644 "$out"
    trap - EXIT
    echo "wrote $out ($(wc -l < "$out") lines)" ;;
  *)
    echo "usage: bash scripts/gen_crd.sh [--check]" >&2
    exit 2 ;;
esac
