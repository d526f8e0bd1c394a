# The vocabulary of the project: every target does its own set-up on a fresh machine.
#   make run    install, then train the quickstart and print where the curve and report are
#   make test   install, start the real servers, run every test (JUnit XML in build/junit.xml)
#   make bench  side-by-side speed ratios -> bench/results.json
#   make lint   ruff + mypy + import-linter contracts
SHELL := /bin/bash
PY ?= python3
TORCH_VERSION ?= 2.15.0
STAMP := build/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: install run test test-unit lint typecheck bench crd protos infra-up infra-build infra-down clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@mkdir -p build
	@# torch: install once (the registry's Linux wheel is the large CUDA build); never a second copy.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev,distributed,operator]"
	$(PY) -m scalerl.rpc.codegen
	@touch $@

run: install
	$(PY) -m scalerl.cli run examples/quickstart.yaml --overwrite

# The real Kafka broker and MinIO server are built (cached in $$SCALERL_CACHE, ~/.cache/scalerl) and
# started first; the infrastructure tests fail, never skip, when CI is set and they cannot start.
test: install infra-up
	set -a; source build/infra.env; set +a; \
	$(PY) -m pytest -m "not gpu" --junitxml=build/junit.xml $(PYTEST_ARGS); rc=$$?; \
	bash scripts/infra/down.sh >/dev/null 2>&1 || true; exit $$rc

test-unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check services operators tests bench
	$(PY) -m mypy
	lint-imports

typecheck: install
	$(PY) -m mypy

# Side by side in one run; the distributed part uses the real Kafka and MinIO that infra-up starts.
bench: install infra-up
	set -a; source build/infra.env; set +a; $(PY) bench/run_bench.py --out bench/results.json

# Python stubs of protos/ into the gitignored scalerl/rpc/gen (also done by install and on import).
protos: install
	$(PY) -m scalerl.rpc.codegen --force

# The Helm chart's copy of the RLJob CRD, regenerated from the operator's models (a test fails when stale).
crd: install
	PY=$(PY) bash scripts/gen_crd.sh

infra-up: install
	bash scripts/infra/up.sh

infra-build:
	bash scripts/infra/up.sh --build-only

infra-down:
	bash scripts/infra/down.sh

clean:
	rm -rf build runs bench/results.json
