# GraphMend developer commands; `make demo` and `make test` work from a clean clone.
#
# Two environments: .venv (newest transformers) and .venv-tf4 (a transformers
# 4.x release, still pinned by many deployments).  torch is pinned to the
# CPU build that lies on this project's machines; the package itself only
# asks for torch>=2.5.

PYTHON ?= python3
TORCH_PIN := torch==2.13.0
TF4_PIN := transformers==4.51.3
VENV := .venv
VENV_TF4 := .venv-tf4
PYTEST_FLAGS ?= -q
SETUP_INPUTS := pyproject.toml src/graphmend_hook.py src/graphmend_hook.pth

.PHONY: demo test test-latest test-tf4 lint format clean

$(VENV)/.ready: $(SETUP_INPUTS)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)" -e ".[dev]"
	touch $@

$(VENV_TF4)/.ready: $(SETUP_INPUTS)
	$(PYTHON) -m venv $(VENV_TF4)
	$(VENV_TF4)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)" "$(TF4_PIN)" -e ".[test]"
	touch $@

demo: $(VENV)/.ready
	$(VENV)/bin/python examples/demo.py

test: test-latest test-tf4

test-latest: $(VENV)/.ready
	$(VENV)/bin/python -m pytest $(PYTEST_FLAGS)

test-tf4: $(VENV_TF4)/.ready
	$(VENV_TF4)/bin/python -m pytest $(PYTEST_FLAGS)

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests bench examples/demo.py
	$(VENV)/bin/ruff format --check src tests bench examples/demo.py

format: $(VENV)/.ready
	$(VENV)/bin/ruff check --fix src tests bench examples/demo.py
	$(VENV)/bin/ruff format src tests bench examples/demo.py

clean:
	rm -rf $(VENV) $(VENV_TF4) .pytest_cache .ruff_cache
