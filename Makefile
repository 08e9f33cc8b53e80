# The two set-up commands of the README are `make demo` (build .venv, run dev mode) and `make test`.
# Everything runs in .venv (git-ignored), built by scripts/venv.sh from Debian's /usr/bin/python3 when it exists,
# else the first python3 on PATH; nothing is installed into a system interpreter (PEP 668).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv test-venv demo test lint bench fuzz test-controls mutate

venv:
	@sh scripts/venv.sh $(VENV) ""

test-venv:
	@sh scripts/venv.sh $(VENV) test

demo: venv
	$(VENV)/bin/openshell-sandbox dev -- sh -c 'echo "hello from the agent: $$(id)"; echo "its network interfaces:"; tail -n +3 /proc/net/dev | cut -d: -f1'

lint: test-venv
	$(PY) -m ruff check supervisor tests bench fuzz mutate
	$(PY) -m ruff format --check supervisor tests bench fuzz mutate
	$(PY) -m mypy

# as root, a missing python3-venv is installed (CI); otherwise the message says how
test:
	bash scripts/install-test-deps.sh
	@sh scripts/venv.sh $(VENV) test --install-missing
	$(PY) -m pytest -q -p no:cacheprovider
	$(PY) -m ruff check supervisor tests bench fuzz mutate
	$(PY) -m ruff format --check supervisor tests bench fuzz mutate
	$(PY) -m mypy

# The protection-off twins of the attacker-side tests (tests/controls.py): each must fail on its assertion, which
# the runner counts as a pass (xfail, strict); `make test` leaves them out.
test-controls: test-venv
	$(PY) -m pytest -q -p no:cacheprovider --controls

# Coverage-guided fuzzing with atheris (fuzz/, docs/design.md "Testing"): every target, or TARGET=name, for
# FUZZ_SECONDS each; resumes from fuzz/corpus/<target>, merges what it found back there and adds its executions to
# fuzz/progress.json. A failing input is kept in fuzz/findings/ and the run exits 1.
FUZZ_SECONDS ?= 60
fuzz: test-venv
	$(PY) -m fuzz.run $(TARGET) --seconds $(FUZZ_SECONDS)

# Mutation testing with mutmut (mutate/run.py, docs/design.md "Testing") of one deciding module, MODULE=name (the
# names are mutate/run.py's MODULES), for at most its stated budget (BUDGET=seconds overrides); the score and the
# surviving mutants go to mutate/scores.json. One module at a time: each mutant runs the module's unit tests.
mutate:
	@sh scripts/venv.sh $(VENV) test,mutate
	$(PY) -m mutate.run $(MODULE) $(if $(BUDGET),--budget $(BUDGET))

# the benchmarks (docs/performance.md); extra arguments with BENCH_ARGS="--quick"
bench: test-venv
	$(PY) bench/run.py $(BENCH_ARGS)

# Real pods: the rendered companion set under rootful podman, models R, P (U where the host allows) and the
# proxy-pod topology, on an internal TEST-NET network (tests/k8s; docs/kubernetes.md "Running the companion set
# under podman"). As root; installs podman, runc, netavark, debootstrap when missing (skips, saying why, where
# this machine cannot run a container at all); the debootstrap bases are cached under
# /var/cache/openshell-sandbox. Two to five minutes; not part of `make test` (.ci/run calls both).
.PHONY: test-k8s
test-k8s:
	bash scripts/install-k8s-test-deps.sh
	@sh scripts/venv.sh $(VENV) test --install-missing
	OPENSHELL_TEST_K8S=1 $(PY) -m pytest -v -p no:cacheprovider --timeout=900 tests/k8s
