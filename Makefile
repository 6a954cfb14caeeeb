# dp_ftrl_tff developer entry points. Every target installs the pinned environment on first use.
PYTHON_BOOTSTRAP ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
IN_SESSION := tools/in_session.sh
PYTEST_ARGS ?=

.PHONY: install test test-fast lint demo bazel-test bench clean

install: $(STAMP)

# Idempotent: reinstalls only when requirements.lock or setup.py changed.
$(STAMP): requirements.lock setup.py
	@test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

test: install
	$(IN_SESSION) $(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(IN_SESSION) $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

demo: install
	$(IN_SESSION) $(PY) -m experiments.demo

bazel-test: install
	bazel test //... --python_path=$(abspath $(PY)) --test_output=errors

clean:
	rm -rf $(VENV) bazel-* .pytest_cache
