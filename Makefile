# dp_ftrl_tff developer entry points. Every target installs the pinned environment on first use.
PYTHON_BOOTSTRAP ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
IN_SESSION := tools/in_session.sh
PYTEST_ARGS ?=

.PHONY: install test test-fast lint demo bazel-test clean

install: $(STAMP)

# Idempotent: reinstalls only when requirements.lock or setup.py changed.
$(STAMP): requirements.lock setup.py
	@test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

test: install
	$(IN_SESSION) $(PY) -m pytest --durations=40 $(PYTEST_ARGS)

test-fast: install
	$(IN_SESSION) $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(PY) tools/gen_bazel_build.py --check

demo: install
	$(IN_SESSION) $(PY) -m experiments.demo

# Every test module is a py_test; Bazel runs their fast tests (`make test` runs the slow ones too).
bazel-test: install
	$(PY) tools/gen_bazel_build.py --check
	bazel test //... --python_path=$(abspath $(PY)) --test_output=errors \
	  --test_env=PYTEST_ADDOPTS="-m 'not slow'" --test_env=TF_CPP_MIN_LOG_LEVEL=2

clean:
	rm -rf $(VENV) bazel-* .pytest_cache
