# The two set-up commands of the README are `make demo` (build .venv, run dev mode) and `make test`.
# Everything runs in .venv (git-ignored), built by scripts/venv.sh from Debian's /usr/bin/python3 when it exists,
# else the first python3 on PATH; nothing is installed into a system interpreter (PEP 668).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv test-venv demo test lint bench

venv:
	@sh scripts/venv.sh $(VENV) ""

test-venv:
	@sh scripts/venv.sh $(VENV) test

demo: venv
	$(VENV)/bin/openshell-sandbox dev -- sh -c 'echo "hello from the agent: $$(id)"; echo "its network interfaces:"; tail -n +3 /proc/net/dev | cut -d: -f1'

lint: test-venv
	$(PY) -m ruff check supervisor tests bench
	$(PY) -m mypy

# as root, a missing python3-venv is installed (CI); otherwise the message says how
test:
	bash scripts/install-test-deps.sh
	@sh scripts/venv.sh $(VENV) test --install-missing
	$(PY) -m pytest -q -p no:cacheprovider
	$(PY) -m ruff check supervisor tests bench
	$(PY) -m mypy

# the benchmarks (docs/performance.md); extra arguments with BENCH_ARGS="--quick"
bench: test-venv
	$(PY) bench/run.py $(BENCH_ARGS)
