# dp_ftrl_tff developer entry points. Every target installs the pinned environment on first use.
PYTHON_BOOTSTRAP ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
IN_SESSION := tools/in_session.sh
PYTEST_ARGS ?=
# Two xdist workers (the machine has 2 cores), a test module per worker at a time: the runs a module
# builds once (module fixtures) are built once.
PYTEST_PARALLEL ?= -n 2 --dist loadfile
RESULTS := .test-results

.PHONY: install test test-fast slowest lint demo bazel-check clean

install: $(STAMP)

# Idempotent: reinstalls only when requirements.lock or setup.py changed.
$(STAMP): requirements.lock setup.py
	@test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Every tier (unit, integration, e2e, paper; docs/TESTING.md). Writes $(RESULTS)/junit.xml, from which
# `make slowest` rewrites the table of the slowest tests in docs/TESTING.md.
test: install
	@mkdir -p $(RESULTS)
	$(IN_SESSION) $(PY) -m pytest $(PYTEST_PARALLEL) --durations=40 \
	  --junitxml=$(RESULTS)/junit.xml $(PYTEST_ARGS)

# The unit and integration tiers without the tests marked slow (no binary as a subprocess, no paper
# reproduction, no whole driver run per mechanism).
test-fast: install
	$(IN_SESSION) $(PY) -m pytest $(PYTEST_PARALLEL) -m "(unit or integration) and not slow" --durations=20 \
	  $(PYTEST_ARGS)

slowest: install
	$(PY) tools/slowest_tests.py --junit=$(RESULTS)/junit.xml

lint: install
	$(VENV)/bin/ruff check .
	$(PY) tools/gen_bazel_build.py --check

demo: install
	$(IN_SESSION) $(PY) -m experiments.demo

# Checks the Bazel BUILD graph without running the suite a second time: builds every target, runs
# every test module's py_test in pytest's --collect-only mode (its imports resolve under Bazel's
# runfiles, no test executes) and each package's `smoke` target (imports every module of it).
bazel-check: install
	$(PY) tools/gen_bazel_build.py --check
	bazel test //... --python_path=$(abspath $(PY)) --test_output=errors \
	  --test_env=PYTEST_ADDOPTS="--collect-only" --test_env=TF_CPP_MIN_LOG_LEVEL=2

clean:
	rm -rf $(VENV) bazel-* .pytest_cache $(RESULTS)
