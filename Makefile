# Two commands for a newcomer: `make demo` and `make test`. Everything else is installed from here.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
DEMO := demo-out
# One test worker more than the cores: about a tenth of a two-worker run waits (a reload's timeout, a server's
# start, a child's exit) with a core idle (benchmarks/results/test-lanes-*.txt).
JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: install demo test test-fast lint fuzz bench gpu-check clean system-tools

$(VENV)/.installed: pyproject.toml scripts/itera_torchvision_shim.py
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "needs $(PYTHON)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, with the torchvision built for it in the same command (timm needs it): pinned, or pip pulls a
	# multi-GB CUDA build of torch.
	$(PIP) install -q torch==2.13.0 torchvision==0.28.0
	$(PIP) install -q -e '.[dev]'
	# That torchvision's compiled operators do not load beside the CPU torch, and transformers imports it: a venv-only
	# import hook declares the two operator schemas when, and only when, its import fails (the script says why).
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  cp scripts/itera_torchvision_shim.py "$$site/" && \
	  echo 'import itera_torchvision_shim; itera_torchvision_shim.install()' > "$$site/itera_torchvision_shim.pth"
	touch $@

install: $(VENV)/.installed system-tools
	@echo "ready: $(VENV)/bin/itera-verify"

# The zstd command line (interoperability tests) and Chromium (HTML report test), from Debian when missing.
system-tools:
	@missing=""; command -v zstd >/dev/null 2>&1 || missing="$$missing zstd"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium fonts-dejavu-core"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing"; (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install$$missing; the tests that need them will skip"; \
	  else echo "warning: missing$$missing (install them for the interoperability and browser tests)"; fi; \
	fi

demo: install
	rm -rf $(DEMO)
	$(PY) -m fixtures.build $(DEMO)/package --hf-cache $(DEMO)/hf-cache
	$(VENV)/bin/itera-verify $(DEMO)/package --hf-cache $(DEMO)/hf-cache -o $(DEMO)/ --report html=$(DEMO)/report.html
	@echo; echo "archive: $$(ls $(DEMO)/*.tar.zst)"; echo "HTML report: $(DEMO)/report.html"

# The linter and the layering contracts (docs/architecture.md) run before the tests.
lint: install
	$(VENV)/bin/ruff check validator tests fixtures benchmarks scripts
	$(VENV)/bin/lint-imports

# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE): otherwise every pytest
# worker rewrites the asserts of all the test modules again (~5 CPU-s each) and every command a test runs compiles
# what it imports from source. The caches go to __pycache__ folders git ignores.
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: lint
	$(PY) -m pytest -n $(JOBS) -q

# Everything but the multi-process fixtures and the slow tests (over ~5 s each), for the edit-test loop: about a
# third of `make test` (benchmarks/results/test-lanes-*.txt); `make test` runs all.
test-fast: lint
	$(PY) -m pytest -n $(JOBS) -q -m "not slow and not multiprocess"

fuzz: install
	$(PY) -m tests.fuzz_all

bench: install
	$(PY) benchmarks/reload_bench.py
	$(PY) benchmarks/floor_bench.py
	$(PY) benchmarks/seal_bench.py
	$(PY) benchmarks/push_bench.py --package campaign
	$(PY) benchmarks/batch_bench.py

gpu-check: install
	bash scripts/gpu-check.sh

clean:
	rm -rf $(DEMO) build dist .pytest_cache
