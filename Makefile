# GraphMend developer commands; `make demo` and `make test` work from a clean clone.
#
# Three environments: .venv (newest transformers), .venv-tf4 (a transformers
# 4.x release, still pinned by many deployments), both on the torch CPU build
# that lies on this project's machines, and .venv-floor: the oldest torch the
# package declares (pyproject: torch>=2.5), for a smoke test.  PyPI has torch
# 2.5.1 only as its CUDA build (about 3.5 GB with its nvidia packages); it runs
# on CPU-only machines.  Keep FLOOR_PINS, pyproject's torch floor and
# torch_releases.TESTED in step.

PYTHON ?= python3
TORCH_PIN := torch==2.13.0
TF4_PIN := transformers==4.51.3
# The property tests' examples depend on Hypothesis's version: pinned, so that CI
# (which sets CI=true: Hypothesis's "ci" profile, derandomized) draws the same
# programs on every run.  Local runs draw new programs each time.  It needs Python
# 3.11; on 3.10 pip takes the newest release that runs there (the test extra's range).
HYPOTHESIS_PIN := hypothesis==6.170.17; python_version >= '3.11'
FLOOR_PINS := torch==2.5.1 transformers==4.51.3
VENV := .venv
VENV_TF4 := .venv-tf4
VENV_FLOOR := .venv-floor
# Free disk (GiB) the floor environment needs to be built: about 5.5 GB installed and
# 3 GB more of downloaded wheels while pip unpacks them.  With less, `make test-floor`
# says so and skips the smoke test instead of failing half way through pip.
FLOOR_FREE_GIB := 10
# The tests run in one worker process per core (pytest-xdist): most of their time is
# TorchDynamo tracing in Python, one core each.
PYTEST_FLAGS ?= -q -n auto
# The smoke test on the floor: import of real model code through the hook,
# T1/T2/T3 compiled (backend eager), and the warnings of what an old torch lacks.
# Deselected: printing x.shape under fullgraph=True, which keeps its break on
# torch 2.5 and 2.6 (see README, "Supported torch releases").
FLOOR_TESTS := tests/test_torch_support.py tests/test_notices.py tests/test_trap.py tests/test_defer.py \
	tests/test_predicate.py tests/test_hook.py tests/test_dynamic_shapes.py tests/test_user_workflows.py \
	tests/test_skipped_frames.py tests/test_from_python.py tests/test_subgraphs.py \
	tests/test_branch_effects.py tests/test_language_corners.py tests/test_recompiles.py \
	tests/test_host_comparisons.py \
	tests/test_continuation.py::test_a_branch_reading_a_symbolic_number_adds_no_graph \
	tests/test_guards_adversarial.py::test_an_input_updated_uncounted_before_a_failing_guard_stays_updated \
	tests/test_continuation_adversarial.py::test_a_rest_updating_its_argument_updates_the_callers_tensor \
	tests/test_continuation_adversarial.py::test_a_rest_drawing_random_numbers_draws_what_the_original_draws
# On transformers 4.x: the tests whose subject is transformers' own code or API (the
# rest exercise GraphMend on code of their own and run once, in .venv).
TF4_TESTS := tests/test_analysis.py tests/test_defer.py tests/test_explain.py \
	tests/test_real_models.py tests/test_remote_corpus.py tests/test_settings.py \
	tests/test_torch_support.py tests/test_hook.py tests/test_diff_display.py
SETUP_INPUTS := pyproject.toml src/graphmend_hook.py src/graphmend_hook.pth

.PHONY: demo test test-latest test-tf4 test-floor lint format clean

$(VENV)/.ready: $(SETUP_INPUTS)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)" "$(HYPOTHESIS_PIN)" -e ".[dev]"
	touch $@

$(VENV_TF4)/.ready: $(SETUP_INPUTS)
	$(PYTHON) -m venv $(VENV_TF4)
	$(VENV_TF4)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)" "$(TF4_PIN)" "$(HYPOTHESIS_PIN)" -e ".[test]"
	touch $@

$(VENV_FLOOR)/.ready: $(SETUP_INPUTS)
	$(PYTHON) -m venv $(VENV_FLOOR)
	$(VENV_FLOOR)/bin/python -m pip install --quiet --disable-pip-version-check $(FLOOR_PINS) "$(HYPOTHESIS_PIN)" -e ".[test]"
	touch $@

demo: $(VENV)/.ready
	$(VENV)/bin/python examples/demo.py

test: test-latest test-tf4 test-floor

test-latest: $(VENV)/.ready
	$(VENV)/bin/python -m pytest $(PYTEST_FLAGS)

test-tf4: $(VENV_TF4)/.ready
	$(VENV_TF4)/bin/python -m pytest $(PYTEST_FLAGS) $(TF4_TESTS)

test-floor:
	@free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); \
	if [ ! -f $(VENV_FLOOR)/.ready ] && [ "$$free" -lt $(FLOOR_FREE_GIB) ]; then \
		echo "test-floor SKIPPED: $$free GiB free, building $(VENV_FLOOR) (torch 2.5.1) needs $(FLOOR_FREE_GIB) GiB"; \
	else \
		$(MAKE) --no-print-directory $(VENV_FLOOR)/.ready && \
		$(VENV_FLOOR)/bin/python -m pytest $(PYTEST_FLAGS) -m "not inductor" $(FLOOR_TESTS); \
	fi

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests bench examples/demo.py
	$(VENV)/bin/ruff format --check src tests bench examples/demo.py

format: $(VENV)/.ready
	$(VENV)/bin/ruff check --fix src tests bench examples/demo.py
	$(VENV)/bin/ruff format src tests bench examples/demo.py

clean:
	rm -rf $(VENV) $(VENV_TF4) $(VENV_FLOOR) .pytest_cache .ruff_cache
