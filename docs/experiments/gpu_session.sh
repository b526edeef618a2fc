#!/usr/bin/env bash
# One lent GPU session in one call (the device tool: at most 10 minutes a command, 15 of device time).
#   1. prerequisites, in the first seconds: a CUDA torch (else nothing runs), transformers (else the
#      Hugging Face references are left out with --no-hf), pytest; one line each in summary.txt;
#   2. the speed figures of docs/performance.md: `bench train --shape` at gpt2-small, transformer-base
#      and bert-base (T 128 and 512), bf16, eager then compiled; `bench decode` at batch 32 and 1;
#      `bench encoder`; then `pytest -m cuda` (correctness only: nothing timed there). Under 6 minutes
#      on an H100 (each phase has its own limit);
#   3. what time is left: `bench train` (the small shape of earlier sessions) and `bench attention`.
# Every bench writes its records to OUT as it makes them (OUT/NAME.jsonl, its stderr OUT/NAME.log),
# so a run cut short keeps what it measured; OUT/summary.txt says how each phase ended. Run from the
# repository root with a Python that has torch with CUDA:
#   bash docs/experiments/gpu_session.sh "$OUT"
# DEVICE=cpu BUDGET=60 runs the same phases on the CPU: a check of the script, not a measurement.
set -u
OUT=${1:-gpu-out}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-560}  # seconds for the whole script; the device call's timeout leaves a margin above it
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

# phase NAME LIMIT CMD...: run CMD for at most LIMIT seconds (less if the budget is shorter); its
# stdout (the JSON records) to OUT/NAME.jsonl, its stderr to OUT/NAME.log.
phase() {
  local name=$1 limit=$2; shift 2
  ((limit > $(left) - 10)) && limit=$(($(left) - 10))
  ((limit < 5)) && { say "$name: skipped, no time left"; return; }
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.jsonl" 2>"$OUT/$name.log"
  say "$name: exit $? after $((SECONDS - t0)) s (limit $limit)"
}

# -- 1. prerequisites ---------------------------------------------------------------------------------
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  >>"$OUT/summary.txt" 2>&1
if ! $PY -c "import torch, sys; sys.exit(0 if '$DEVICE' == 'cpu' or torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "no CUDA torch in $PY: nothing to measure"; exit 1
fi
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$OUT/summary.txt" 2>&1
NO_HF=""
if $PY -c 'import transformers; print("transformers", transformers.__version__)' >>"$OUT/summary.txt" 2>&1; then :
else NO_HF="--no-hf"; say "no transformers: the Hugging Face references are left out (--no-hf)"; fi
PYTEST=yes
$PY -c 'import pytest' 2>/dev/null || { PYTEST=""; say "no pytest: pytest -m cuda is skipped"; }
IGNORE=""  # the device machine's Python may lack starlette (attnlab serve): its test module stops the collection
$PY -c 'import starlette' 2>/dev/null || IGNORE="--ignore=tests/test_serve.py"

# -- 2. the speed figures, then the CUDA tests --------------------------------------------------------
A="$PY -m attnlab.cli"
SIZE=""  # the shapes' own batches; on the CPU (a check of the script) one sequence of 16 tokens
[ "$DEVICE" = cpu ] && SIZE="--batch 1 --seq-len 16"
SHAPE="$A bench train --device $DEVICE --precision bf16 --repeats 5 --json $NO_HF $SIZE --shape"
phase train_gpt2_small 60 $SHAPE gpt2-small
phase train_transformer_base 60 $SHAPE transformer-base
phase train_bert_base_128 45 $SHAPE bert-base
phase train_bert_base_512 45 $SHAPE bert-base --seq-len 512
phase train_gpt2_small_compiled 90 $SHAPE gpt2-small --compile
phase decode_b32 50 $A bench decode --device "$DEVICE" --weights fp32 bf16 --json $NO_HF
phase decode_b1 40 $A bench decode --device "$DEVICE" --weights fp32 bf16 --batch 1 --json $NO_HF
phase encoder 30 $A bench encoder --device "$DEVICE" --json $NO_HF
[ -n "$PYTEST" ] && phase pytest_cuda 120 $PY -m pytest -q -m cuda -p no:cacheprovider $IGNORE -rfE

# -- 3. with the time left -----------------------------------------------------------------------------
phase train_small 60 $A bench train --device "$DEVICE" --repeats 5 --json $NO_HF
phase attention 45 $A bench attention --device "$DEVICE" --lengths 1024 4096 16384 --time-limit 2 --json
[ -n "$PYTEST" ] && grep -h -E "passed|failed|error" "$OUT/pytest_cuda.jsonl" 2>/dev/null | tail -3 >>"$OUT/summary.txt"
say "done after $((SECONDS - START)) s"
