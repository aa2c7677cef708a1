# `make run` and `make test` do all set-up on a fresh machine: venv, install, then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
FBGEMM_EXTRA := $(if $(GPU),gpu,cpu)
export DO_NOT_TRACK := true
export KEDRO_DISABLE_TELEMETRY := true
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: install airflow system-packages run test test-fast test-planner lint bench bench-preprocess torchrec clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# torch==2.13.0 must be installed before fbgemm-gpu-cpu so pip never pulls a CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[$(FBGEMM_EXTRA),dev,spark,second_order]'
	touch $@

install: $(VENV)/.installed

# Airflow (the nightly retrain's DAG, tests/e2e/test_airflow.py): heavy, so only `make test`
# installs it; where it cannot be installed that test skips, saying so
$(VENV)/.airflow: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install -e '.[$(FBGEMM_EXTRA),dev,spark,second_order,airflow]' && touch $@ \
		|| echo "warning: Airflow could not be installed: tests/e2e/test_airflow.py will skip"

airflow: $(VENV)/.airflow

# Debian packages some tests use (headless Chromium) and Spark needs (Java 17); skipped with a
# warning where they cannot be installed (see scripts/system_packages.sh, scripts/java.sh)
system-packages:
	@bash scripts/system_packages.sh
	@bash scripts/java.sh

run: install
	$(BIN)/kedro run --pipelines=dlrm

bench-preprocess: install system-packages
	nice -n 5 $(BIN)/python benchmarks/bench_preprocess.py

# every test in one pytest run on NWORKERS pytest-xdist workers, a file's tests on one worker (an
# e2e file's tests share its runs); the longest files start first (tests/conftest.py's
# LONGEST_FIRST, hence --no-loadscope-reorder) and torch's threads sleep rather than spin while they
# wait (its OMP_WAIT_POLICY), so more workers than cores fill the time the rank- and host-starting
# tests spend waiting. The order is random (the seed in the header repeats it). The project's
# modules are compiled first: where PYTHONDONTWRITEBYTECODE is set (it is on our machines), every
# process the tests start would otherwise compile them again from source
NWORKERS ?= 3
test: install system-packages airflow
	$(BIN)/python -m compileall -q -j 2 src tests > /dev/null
	$(BIN)/python -m pytest -n $(NWORKERS) --dist loadfile --no-loadscope-reorder

# the unit tests alone (no processes, no training runs, no Spark, no planning of drawn mixes)
test-fast: install
	$(BIN)/python -m compileall -q -j 2 src tests > /dev/null
	$(BIN)/python -m pytest tests/unit -q -n 2

# the planner's geometry, properties and balance over drawn mixes (CPU minutes; `make test` runs them)
test-planner: install
	$(BIN)/python -m pytest tests/planner -q -n 2

lint: install
	$(BIN)/ruff check src tests benchmarks

bench: install
	$(BIN)/python benchmarks/bench_train.py

# optional: TorchRec's DLRM_DCN as a bench_train.py contender. Its wheel's requirements name the
# CUDA build of fbgemm_gpu, which would replace fbgemm-gpu-cpu, so it goes in without them and its
# pure-Python requirements are named here (versions checked with torch 2.13 + fbgemm-gpu-cpu 1.8)
torchrec: install
	$(BIN)/python -m pip install --no-deps torchrec==1.8.0 tensordict==0.15.3 torchmetrics==1.0.3 \
		lightning-utilities==0.15.3 pyre-extensions==0.0.32 typing-inspect==0.9.0 \
		mypy-extensions==1.2.0 pyvers==0.2.3 iopath==0.1.10 portalocker==4.4.2

clean:
	rm -rf data/0[2-8]*/* mlruns/mlflow.db mlruns/[0-9]*
