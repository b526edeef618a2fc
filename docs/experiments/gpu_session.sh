#!/usr/bin/env bash
# One lent GPU session in one call (the device tool: about 10 minutes of a command, 15 of device time).
#   1. the GPU benches on a quiet machine (docs/performance.md, "GPU");
#   2. the SCAN sweeps of docs/claims.md in the background, 12 runs at a time,
#      while `pytest -m cuda` checks the GPU path beside them (correctness only: nothing timed there).
# Everything lands in OUT (default ./gpu-out): summary.txt, logs.tgz (every log and bench record) and
# sweeps.tgz (the sweeps' run directories without checkpoints; `attnlab sweep SPEC --out DIR --report`
# rebuilds their tables). Run from the repository root with a Python that has torch with CUDA:
#   bash docs/experiments/gpu_session.sh "$OUT"
set -u
OUT=${1:-gpu-out}
LOGS=/tmp/gpu-logs
BUDGET=${BUDGET:-560}  # seconds for the whole script; the device call's timeout leaves a margin above it
mkdir -p "$OUT" "$LOGS"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }

# phase NAME LIMIT CMD...: run CMD for at most LIMIT seconds (less if the budget is shorter), log it.
phase() {
  local name=$1 limit=$2; shift 2
  ((limit > $(left) - 20)) && limit=$(($(left) - 20))
  ((limit < 5)) && { echo "$name: skipped, no time left" | tee -a "$OUT/summary.txt"; return; }
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s (limit $limit)" | tee -a "$OUT/summary.txt"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >>"$OUT/summary.txt" 2>&1

A="$PY -m attnlab.cli"
phase bench_decode_b32 70 $A bench decode --device cuda --weights fp32 bf16 --json
phase bench_decode_b1 50 $A bench decode --device cuda --weights fp32 bf16 --batch 1 --json
phase bench_train 80 $A bench train --device cuda --repeats 5 --json
phase bench_attention 45 $A bench attention --device cuda --lengths 1024 4096 16384 --time-limit 2 --json
phase bench_encoder 30 $A bench encoder --device cuda --json

# The sweeps, one after the other in the background, one thread a run; each stopped (SIGINT: resumable)
# 25 s before the budget ends.
sweep() {
  local spec=$1 dir=$2 limit=$(($(left) - 25))
  ((limit < 30)) && { echo "$spec: not started, no time left" >>"$OUT/summary.txt"; return; }
  OMP_NUM_THREADS=1 timeout --signal=INT --kill-after=10 "$limit" $A sweep "$spec" --out "$dir" --jobs 12 >>"$LOGS/sweeps.log" 2>&1
  echo "$spec: exit $? (limit $limit s)" >>"$OUT/summary.txt"
}
( sweep recipes/claims/scan_splits_sweep.yaml runs/scan-splits
  sweep recipes/claims/scan_remedies_sweep.yaml runs/scan-remedies ) &
# The device machine's Python has no starlette (attnlab serve): its test module would stop the collection.
phase pytest_cuda 240 $PY -m pytest -q -m cuda -p no:cacheprovider --ignore=tests/test_serve.py -rfE
wait

tar czf "$OUT/logs.tgz" -C "$LOGS" .
tar czf "$OUT/sweeps.tgz" --exclude=checkpoints --exclude=tensorboard runs/scan-splits runs/scan-remedies 2>/dev/null
grep -h -E "passed|failed|error" "$LOGS/pytest_cuda.log" | tail -3 >>"$OUT/summary.txt"
grep -h "^\[" "$LOGS/sweeps.log" | tail -n 40 >>"$OUT/summary.txt"
