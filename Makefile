# Two commands set up a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= /tmp/mural_demo
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m mural.main --config=configs/demo.py --workdir=$(WORKDIR)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -rfE tests

clean:
	rm -rf $(VENV) build *.egg-info
