#!/usr/bin/env bash
# The GPU checks, as one run of at most 10 minutes on a lent GPU machine (docs/gpu.md says what each prints).
# Needs python3 with torch (CUDA), transformers >= 5.24, accelerate, optuna, sqlalchemy and ray importable; no hub
# and no registry: every model is the shipped mini pair or built on the device from dimr/hub_configs.
# Writes into $OUT (default gpu-out/):
#   gpu.txt        devices and versions
#   memory.txt     the scorer's memory estimate vs torch.cuda.max_memory_allocated (big vocabulary, gemma-2-2b)
#   search.txt     the search on mini in-process and with Ray on the physical GPU(s)
#   forward.txt    forward costs of gemma-2-2b / gemma-2-9b (random weights) by tokens and kept layers
#   bench_*.txt    bench-decode of mini, eager and compiled (CUDA graphs)
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} DIMR_HOME=${DIMR_HOME:-$OUT/home}
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c 'import torch, transformers, optuna, ray; print("torch", torch.__version__, "transformers",
    transformers.__version__, "optuna", optuna.__version__, "ray", ray.__version__, torch.cuda.get_device_name(),
    "x", torch.cuda.device_count())' | tee -a "$OUT/gpu.txt"
DEVICE=${DEVICE:-cuda} NEW=${NEW:-48}  # DEVICE=cpu NUM=1 NEW=8: a dry run of the plumbing
PROMPTS="--prompts dimr/zoo/data/humaneval_prompts.jsonl --prompts dimr/zoo/data/heldout_task.jsonl --num-prompts ${NUM:-2}"
SLIM=benchmarks/results/mini_slim.json
echo "== memory: estimate vs measured" | tee "$OUT/memory.txt"
timeout 45 $PY benchmarks/memory_check.py --device $DEVICE --dtype bfloat16 --num-sequences 32 --seq-len 128 \
    2>&1 | tee -a "$OUT/memory.txt"
echo "== search on the GPU, in-process" | tee "$OUT/search.txt"
timeout 45 $PY -m dimr.cli search --pair mini --budget 4 --trials 20 --workers 1 --device $DEVICE \
    --storage "sqlite:///$OUT/gpu.db" --study gpu 2>&1 | tail -3 | tee -a "$OUT/search.txt"
echo "== search on the GPU, Ray (one actor per GPU)" | tee -a "$OUT/search.txt"
timeout 100 $PY -m dimr.cli search --pair mini --budget 4 --trials 20 --workers 2 \
    --storage "sqlite:///$OUT/gpu.db" --study gpu-ray 2>&1 | tail -3 | tee -a "$OUT/search.txt"
if [ "$DEVICE" != cpu ]; then
    echo "== random-weight models from the real configs" | tee "$OUT/forward.txt"
    timeout 170 $PY benchmarks/gpu_models.py 2>&1 | tee -a "$OUT/forward.txt"
fi
echo "== bench-decode, eager" | tee "$OUT/bench_eager.txt"
timeout 70 $PY benchmarks/bench_decode.py --pair mini --slim $SLIM $PROMPTS --max-new-tokens $NEW --device $DEVICE \
    --no-hf 2>&1 | tee -a "$OUT/bench_eager.txt"
echo "== bench-decode, compiled" | tee "$OUT/bench_compiled.txt"
timeout 110 $PY benchmarks/bench_decode.py --pair mini --slim $SLIM $PROMPTS --max-new-tokens $NEW --device $DEVICE \
    --modes ${CMODES:-ar,sd,via} --no-hf --compiled 2>&1 | tee -a "$OUT/bench_compiled.txt"
