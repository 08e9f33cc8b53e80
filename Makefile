# The two set-up commands of the README are `make demo` (install + run dev mode) and `make test`.
PYTHON ?= python3

.PHONY: install demo test lint

install:
	$(PYTHON) -m pip install -q --disable-pip-version-check .

demo: install
	openshell-sandbox dev -- sh -c 'echo "hello from the agent: $$(id)"; echo "its network interfaces:"; tail -n +3 /proc/net/dev | cut -d: -f1'

lint:
	$(PYTHON) -m ruff check supervisor tests bench
	$(PYTHON) -m mypy

test:
	bash scripts/install-test-deps.sh
	$(PYTHON) -m pytest -q -p no:cacheprovider
	$(MAKE) lint
