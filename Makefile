# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The one place torch is pinned. It is installed only when the environment has no torch:
# here that takes the local CPU wheel; GPU hosts keep the CUDA build they already carry.
TORCH_PIN ?= torch==2.13.0
DEMO_WORKLOAD ?= resnet18

.PHONY: install demo test bench reproduce lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[dev,frameworks,zoo]"
	touch $@

# The most complete profile dnnperf makes of its default workload: the machine calibrated once (reused
# afterwards), then stages, layers and memory at three batch sizes on an on-disk dataset.
demo: install
	$(BIN)/dnnperf hw --show -q >/dev/null 2>&1 || $(BIN)/dnnperf hw
	$(BIN)/dnnperf profile $(DEMO_WORKLOAD) --preset small --sweep 4,16,32 --steps 10 --warmup 3 --data disk --layers --memory

# Two passes: every timed test first, alone, on a machine no other test has loaded yet (as they ran
# when the suite was one pass), then the tests that time nothing, sharing the cores: three workers on
# CI's 2 cores, since many of these tests wait on processes of their own (ranks, watched commands,
# signals): the shared pass took 10.3-11.2 min with three, 10.9-11.2 with two, on one 2-core host.
# Plain `pytest` runs everything alone.
TEST_WORKERS ?= 3

# The report's browser test renders it in Debian's chromium: installed here when missing (quietly, once).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

test: install
	@command -v chromium >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null)
	status=0; \
	$(BIN)/python -m pytest -q -m "not concurrent" || status=$$?; \
	$(BIN)/python -m pytest -q -m concurrent -n $(TEST_WORKERS) --dist loadfile || status=$$?; \
	exit $$status

bench: install
	$(BIN)/python benchmarks/run_benchmarks.py --json bench-results.json
	$(BIN)/python benchmarks/layer_benchmarks.py
	$(BIN)/python benchmarks/memory_benchmarks.py
	$(BIN)/python benchmarks/distributed_benchmarks.py
	$(BIN)/python benchmarks/memsave_benchmarks.py --out memsave-benchmarks.json
	OMP_NUM_THREADS=1 $(BIN)/dnnperf hw -q --output model-hw-1thread.json
	$(BIN)/python benchmarks/predict_speed.py --profile model-hw-1thread.json --json predict-speed.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/model_validation.py --profile model-hw-1thread.json --json model-validation.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/heldout_validation.py --profile model-hw-1thread.json --json heldout-validation.json --markdown heldout-validation.md
	$(BIN)/dnnperf validate --collectives --json > model-collectives.json
	$(BIN)/dnnperf validate resnet18 vgg16 gpt2 --batch-sizes 8,16 --distributed dp,pp,tp --hw model-hw-1thread.json --json > model-distributed.json

# The seed papers' experiments re-run with dnnperf's commands (15 minutes on 2 cores); rewrites
# docs/reproductions.md with the claims beside the measurements and the commands behind them.
reproduce: install
	$(BIN)/dnnperf reproduce all

lint: install
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) dnnperf-runs .pytest_cache
