# Every target works on a fresh clone: it makes .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU build of torch, pinned so a fresh machine does not pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-py312 test-gpu test-gpu-parallel lint bench-planner clean venv

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[train,dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# worksteal: a worker that runs out of tests takes the other's queued ones, so the run does not end
# on one worker (tests/conftest.py starts the modules with multi-process tests first). xdist_group
# marks have no effect with pytest 9.2 + xdist 3.8 (loadgroup's group suffix on the node id is
# lost), so loadgroup ran as plain load. --durations: every CI log names the slowest tests.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=25 tests

# the tests not marked slow (no multi-process training jobs): about half a minute on 2 cores
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow" tests

# The planner on Python 3.12 with the newest release of every dependency, in a fresh venv each run
# (so a new release that breaks us fails CI): no torch (PyPI's 3.12 torch is a CUDA build of several
# GB), so the planner and foundation tests that need it skip, and the demo runs its plan and estimate.
PY312 ?= $(HOME)/.pyenv/versions/3.12.1/bin/python
VENV312 := .venv-py312
test-py312:
	@test -x "$(PY312)" || { echo "test-py312: no Python 3.12 at $(PY312); install it (pyenv install 3.12.1) or set PY312=" >&2; exit 1; }
	rm -rf $(VENV312)
	$(PY312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q --upgrade pip
	$(VENV312)/bin/python -m pip install -q --upgrade -e ".[plot]" pytest hypothesis
	$(VENV312)/bin/python -m pip list 2>/dev/null | grep -iE '^(highspy|pymetis|networkx|scipy|numpy|pyyaml|rich) '
	$(VENV312)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/planner tests/foundation
	HEXISCALE_DEMO_OUT=$(VENV312)/demo-output $(VENV312)/bin/python -m examples.demo --planner-only

# On a GPU machine (its own python with a CUDA torch; no venv): the GPU smoke tests and the NCCL
# oracle suites (2 and 4 ranks, launch jobs). Carry pymetis/highspy there if missing.
test-gpu:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest -m gpu -v -p no:cacheprovider tests $(PYTEST_ARGS)

# The same files in ~7 minutes instead of ~10: files that share the GPUs side by side, the ones that
# start the MPS daemon (marked gpu_alone) alone after them; per-file logs in gpu-suite-logs/.
test-gpu-parallel:
	$(PYTHON) tests/gpu_suite.py --logs gpu-suite-logs $(PYTEST_ARGS)

# ruff, mypy, and the layer rules (planner <- executor <- hexiscale; tests/foundation/test_layers.py)
lint: $(STAMP)
	$(VENV)/bin/ruff check planner executor hexiscale tests benchmarks examples
	$(VENV)/bin/mypy planner executor hexiscale
	$(PY) -m pytest -q -p no:cacheprovider tests/foundation/test_layers.py

# Planner benchmarks (programs, not tests): tables on stdout, JSON under benchmarks/results/.
bench-planner: $(STAMP)
	$(PY) -m benchmarks.planner.scaling
	$(PY) -m benchmarks.planner.optimality
	$(PY) -m benchmarks.planner.baselines

clean:
	rm -rf $(VENV) $(VENV312) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
