#!/usr/bin/env bash
# The GPU checks, as one short run on a lent GPU machine (README: "On a GPU"). Needs python3 with torch (CUDA),
# transformers >= 5.24, optuna and sqlalchemy importable; writes into $OUT (default gpu-out/).
#   1. bench-decode, every mode + HF assisted generation, eager, on the GPU;
#   2. an in-process search (`--workers 1 --device $DEVICE`), whose mask costs are then re-scored on the CPU;
#   3. bench-decode of every mode, eager and with static caches and compiled forwards (CUDA graphs).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, optuna; print("torch", torch.__version__, "transformers",
    transformers.__version__, "optuna", optuna.__version__, torch.cuda.get_device_name())' | tee -a "$OUT/gpu.txt"
DEVICE=${DEVICE:-cuda} NEW=${NEW:-48}  # DEVICE=cpu NUM=1 NEW=8: a dry run of the plumbing
PROMPTS="--prompts dimr/zoo/data/humaneval_prompts.jsonl --prompts dimr/zoo/data/heldout_task.jsonl --num-prompts ${NUM:-4}"
SLIM=benchmarks/results/mini_slim.json
echo "== bench-decode, eager" | tee "$OUT/bench_eager.txt"
timeout 150 python3 benchmarks/bench_decode.py --pair mini --slim $SLIM $PROMPTS --max-new-tokens $NEW --device $DEVICE \
    2>&1 | tee -a "$OUT/bench_eager.txt"
echo "== search on the GPU" | tee "$OUT/search.txt"
timeout 120 python3 -m dimr.cli search --pair mini --budget 4 --trials 30 --workers 1 --device $DEVICE \
    --storage "sqlite:///$OUT/gpu.db" --study gpu 2>&1 | tail -8 | tee -a "$OUT/search.txt"
echo "== bench-decode, compiled" | tee "$OUT/bench_compiled.txt"
timeout 300 python3 benchmarks/bench_decode.py --pair mini --slim $SLIM $PROMPTS --max-new-tokens $NEW --device $DEVICE \
    --modes ${CMODES:-ar,sd,self,via} --no-hf --compiled 2>&1 | tee -a "$OUT/bench_compiled.txt"
