# One target per workflow; each calls the real command so people and CI run the same thing.
PY      := .venv/bin/python
STAMP   := .venv/.installed-stamp

.PHONY: setup demo test test-vllm test-gpu fuzz lint lint-policy bench clean

setup: $(STAMP)

# torch==2.13.0 first: on the CI machines that is a CPU build taken from local disk;
# an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[kernels,test,dev]'
	touch $(STAMP)

# The demo needs the base package only (no torch): its own small environment, built in
# seconds. pip's --python installs into an environment created without a pip of its own.
DEMO_ENV   := .venv-demo
DEMO_STAMP := $(DEMO_ENV)/.installed-stamp

demo: $(DEMO_STAMP)
	MOE_POLICY_CLI=$(DEMO_ENV)/bin/moe-policy PYTHON=$(DEMO_ENV)/bin/python bash scripts/demo.sh

$(DEMO_STAMP): pyproject.toml
	python3 -m venv --without-pip $(DEMO_ENV)
	python3 -m pip --python $(DEMO_ENV)/bin/python install -q -e .
	touch $(DEMO_STAMP)

test: setup
	$(PY) -m pytest -n 2 -q tests
	$(PY) -m pytest -q --doctest-modules moe_policy --ignore=moe_policy/experts

# vLLM 0.33.0's real selection code on the CPU (its own environment, no CUDA packages):
# the plugin through vLLM's loader, vLLM's selection scenarios, the differential grid.
VLLM_ENV := .venv-vllm
test-vllm:
	bash scripts/vllm_env.sh $(VLLM_ENV)
	$(VLLM_ENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/vllm

test-gpu:
	python3 -m pytest -q -m gpu tests

# The long fuzz run (docs/testing.md): FUZZ_CASES policy files (default 10000), with model
# configs, environment values and flags in proportion; FUZZ_SEED, FUZZ_JOBS.
fuzz: setup
	$(PY) -m tests.fuzz.run

lint: setup
	$(PY) -m ruff check moe_policy tests benchmarks tools
	$(PY) -m ruff format --check moe_policy tests benchmarks tools
	$(PY) -m mypy

lint-policy: setup
	.venv/bin/moe-policy lint configs/default.yaml configs/profiles/*.yaml
	.venv/bin/moe-policy lint --engine vllm configs/engines/vllm-0.33/default.yaml
	.venv/bin/moe-policy lint --engine vllm/fp8 configs/engines/vllm-0.33/fp8-default.yaml
	.venv/bin/moe-policy lint --engine vllm/mxfp4 configs/engines/vllm-0.33/mxfp4-default.yaml
	.venv/bin/moe-policy lint --engine vllm/nvfp4 configs/engines/vllm-0.33/nvfp4-default.yaml
	.venv/bin/moe-policy lint --engine vllm/int_wna16 configs/engines/vllm-0.33/int_wna16-default.yaml
	.venv/bin/moe-policy lint --engine vllm/mxfp8 configs/engines/vllm-0.33/mxfp8-default.yaml
	.venv/bin/moe-policy lint --engine vllm/int8 configs/engines/vllm-0.33/int8-default.yaml
	.venv/bin/moe-policy lint --engine vllm/w4a8 configs/engines/vllm-0.33/w4a8-default.yaml
	.venv/bin/moe-policy lint --engine vllm/w4a8_int8 configs/engines/vllm-0.33/w4a8_int8-default.yaml

bench: setup
	$(PY) -m benchmarks.policy
	$(PY) -m benchmarks.cli

clean:
	rm -rf .venv .venv-demo .venv-vllm build dist *.egg-info
