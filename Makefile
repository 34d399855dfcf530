# Two commands do everything on a fresh machine:
#   make repro   set up .venv, then run the whole pipeline (dvc repro) on the CPU default profile
#   make test    set up .venv, then run the tests
#   make ui      start a local Prefect server (UI on http://127.0.0.1:4200) and serve the flows
PY      := .venv/bin/python
STAMP   := .venv/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export MLFLOW_ENABLE_TELEMETRY := false
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup repro test test-all ui screenshot clean-data

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import tvm, torch, trl, peft, prefect, mlflow, great_expectations, dvc, distributed, tornado"
	touch $(STAMP)

repro: setup
	dvc repro

test: setup
	$(PY) -m pytest -n 2 --dist loadfile -q --durations=12
	$(PY) -m pytest -n 2 --dist loadfile -q -m slow
	$(PY) -m pytest -q -m integration

test-all: setup
	$(PY) -m pytest -n 2 --dist loadfile -q -m "not gpu"

ui: setup
	$(PY) -m flows.ui

screenshot: setup
	$(PY) -m flows.demo

clean-data:
	rm -rf data/search
