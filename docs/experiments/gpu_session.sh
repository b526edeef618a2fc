#!/usr/bin/env bash
# One lent GPU session in one call (the device tool: at most 10 minutes a command, 15 of device time).
#   1. prerequisites, in the first seconds: a CUDA torch (else nothing runs), transformers (else the
#      Hugging Face references are left out with --no-hf), pytest; one line each in summary.txt;
#   2. the speed figures of docs/performance/gpu_training.md: `bench train --shape` at gpt2-small, transformer-base
#      and bert-base (T 128 and 512), bf16, both sides compiled (their best mode); gpt2-small and
#      transformer-base also replayed as CUDA graphs (--compile graphs) and their compiled steps under
#      the profiler (docs/experiments/profile_step.py); gpt2-small eager, and with the loss's target
#      logit picked by a gather (docs/experiments/gather_pick_bench.py); `bench decode` at batch 32
#      and 1; `bench encoder`; then `pytest -m cuda` (correctness
#      only: nothing timed there). Not 6 minutes: compiling both sides of a shape takes most of its
#      phase (transformer-base 71 s in all on an H100; gpt2-small 85-93 s, bert-base 98 s at T 128 and
#      106 s at T 512 on an H200, 2026-11-27), so a 15-minute loan (about 850 s of commands once the
#      machine has started) measures a chosen part of this section: name it in PHASES, over two calls;
#   3. the recipes of recipes/gpu/ with the time left (Tiny Shakespeare; Multi30k and its BLEU; SST-2's
#      pre-training and fine-tuning; Transformer-XL with and without memory; Mask-Predict distilled
#      from the Multi30k run), each stopped by train.max_seconds so that it evaluates and checkpoints
#      before its limit. One 10-minute call does not reach them all: name the rest in PHASES (e.g.
#      PHASES="sst2_text sst2_mlm sst2") in a later call on the same warm machine, whose RUNS remain.
# Every phase writes its records to WORK/NAME.jsonl (its stderr to WORK/NAME.log) as it makes them, and
# after each phase WORK is packed into OUT/records.tgz beside OUT/summary.txt (the device tool brings
# back 8 files), so a run cut short keeps what it measured. Run from the repository root with a Python
# that has torch with CUDA, the data of recipes/gpu/ in data/ (the device call carries it):
#   bash docs/experiments/gpu_session.sh "$OUT"
# PHASES="name ..." runs only the phases named, LIMIT_name=SECONDS changes one phase's limit; DEVICE=cpu BUDGET=60 runs them on the CPU: a check of
# the script, not a measurement. Phases whose times are not compared (recipes, pytest) may run as
# concurrent copies of this script, each with its own WORK and OUT, as a later H200 call did:
#   for s in "a multi30k multi30k_bleu" "c pytest_cuda"; do set -- $s; n=$1; shift
#     WORK=/tmp/gs-$n PHASES="$*" bash docs/experiments/gpu_session.sh "$OUT/$n" >/dev/null 2>&1 & done; wait
set -u
OUT=${1:-gpu-out}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-560}  # seconds for the whole script; the device call's timeout leaves a margin above it
WORK=${WORK:-/tmp/gpu-session}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

# limit_of NAME LIMIT: the seconds phase NAME may take: LIMIT, or LIMIT_NAME where set (LIMIT_NAME=SECONDS
# overrides a phase's limit), at most the budget left less 10 s
limit_of() {
  local own="LIMIT_$1" limit=$2; limit=${!own:-$limit}
  ((limit > $(left) - 10)) && limit=$(($(left) - 10))
  echo "$limit"
}
named() { [ -z "${PHASES:-}" ] || [[ " $PHASES " == *" $1 "* ]]; }  # is phase $1 to run?

# phase NAME LIMIT CMD...: run CMD for at most limit_of NAME LIMIT seconds; its stdout (the JSON records)
# to WORK/NAME.jsonl, its stderr to WORK/NAME.log; then pack WORK. Fails (status 1) if it did not run.
phase() {
  local name=$1 limit; limit=$(limit_of "$1" "$2"); shift 2
  named "$name" || return 1
  ((limit < 5)) && { say "$name: skipped, no time left"; return 1; }
  local t0=$SECONDS
  # SIGINT, not TERM: pytest then prints its summary, a training checkpoints what it did (then KILL)
  timeout --signal=INT --kill-after=20 "$limit" "$@" >"$WORK/$name.jsonl" 2>"$WORK/$name.log"
  say "$name: exit $? after $((SECONDS - t0)) s (limit $limit)"
  tail -n 2 "$WORK/$name.jsonl" | cut -c1-600
  tar -czf "$OUT/records.tgz" -C "$WORK" .
  return 0
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
XDIST=""  # pytest-xdist, where installed, spreads the CUDA tests over 4 processes on the one GPU
[ -n "$PYTEST" ] && $PY -c 'import xdist' 2>/dev/null && XDIST="-n 4"
# collect only the modules with CUDA tests (CUDA_TESTS="tests/test_cuda.py::NAME" runs one test)
CUDA_TESTS=${CUDA_TESTS:-$(grep -l "mark.cuda" tests/test_*.py | tr '\n' ' ')}

# -- 2. the speed figures, then the CUDA tests --------------------------------------------------------
A="$PY -m attnlab.cli"
SIZE=""  # the shapes' own batches; on the CPU (a check of the script) one sequence of 16 tokens
[ "$DEVICE" = cpu ] && SIZE="--batch 1 --seq-len 16"
SHAPE="$A bench train --device $DEVICE --precision bf16 --repeats 5 --json $NO_HF $SIZE --shape"
phase train_gpt2_small 150 $SHAPE gpt2-small --compile
# the same, each side's forward, loss and backward replayed as CUDA graphs (--compile graphs, as
# train.compile: graphs runs a step): what removing the step's launch gaps gains (CUDA only)
[ "$DEVICE" = cuda ] && phase train_gpt2_small_graphs 150 $SHAPE gpt2-small --compile graphs
# the same at 32 sequences a step, not 8: how much of the MFU gap is the step's fixed costs (the optimiser,
# clipping, launches), which a larger batch spreads over 4 times the tokens (CUDA only: on the CPU the
# check's one sequence stands)
[ "$DEVICE" = cuda ] && phase train_gpt2_small_b32 150 $SHAPE gpt2-small --batch 32 --compile
# where the compiled gpt2-small step's GPU time goes (matrix products, attention, loss, optimiser, the
# rest; the full kernel table to WORK/profile_gpt2-small_compiled.txt), then the same for transformer-base
phase profile_gpt2_small 100 $PY docs/experiments/profile_step.py --device $DEVICE --shape gpt2-small --compile \
  --out "$WORK" $SIZE
phase profile_transformer_base 80 $PY docs/experiments/profile_step.py --device $DEVICE --shape transformer-base \
  --compile --out "$WORK" $SIZE
phase train_transformer_base 80 $SHAPE transformer-base --compile
[ "$DEVICE" = cuda ] && phase train_transformer_base_graphs 80 $SHAPE transformer-base --compile graphs
phase train_bert_base_128 110 $SHAPE bert-base --compile
phase train_bert_base_512 110 $SHAPE bert-base --seq-len 512 --compile
phase train_gpt2_small_eager 40 $SHAPE gpt2-small
# the same with the loss's target logit picked by a gather (the form before 72dc8f7): what the masked sum
# costs or gains on this GPU, beside train_gpt2_small's (within 0.3% on an H200, 2026-11-27)
phase train_gpt2_small_gather 150 $PY docs/experiments/gather_pick_bench.py bench train --device $DEVICE \
  --precision bf16 --repeats 5 --json $NO_HF $SIZE --shape gpt2-small --compile
phase decode_b32 50 $A bench decode --device "$DEVICE" --weights fp32 bf16 --json $NO_HF
phase decode_b1 40 $A bench decode --device "$DEVICE" --weights fp32 bf16 --batch 1 --json $NO_HF
phase encoder 30 $A bench encoder --device "$DEVICE" --json $NO_HF
# -v: each result as it comes; the JUnit XML keeps every failure's reason (it comes back in records.tgz)
[ -n "$PYTEST" ] && phase pytest_cuda 240 $PY -m pytest -v -m cuda -p no:cacheprovider $XDIST -rfE --tb=short \
  --junitxml="$WORK/pytest_cuda.xml" $CUDA_TESTS

# -- 3. recipes with the time left ---------------------------------------------------------------------
# recipe NAME LIMIT CONFIG SETS...: train CONFIG into RUNS/NAME (outside WORK: its checkpoints stay on the
# machine), stopped by train.max_seconds 40 s before LIMIT; its metrics.jsonl joins the records.
RUNS=${RUNS:-/tmp/gpu-runs}
recipe() {
  local name=$1 limit config=$3; limit=$(limit_of "$1" "$2"); shift 3
  named "$name" || return 1
  ((limit < 45)) && { say "$name: skipped, no time left"; return 1; }  # max_seconds would be under 5 s
  local sets=(--set "train.device=$DEVICE" --set "train.max_seconds=$((limit - 40))")
  if [ "$DEVICE" = cpu ]; then  # a check of the chain: two steps of a one-layer model (a fine-tuning keeps its own)
    sets+=(--set train.max_steps=2 --set train.eval_every=2)
    grep -q init_from "$config" || sets+=(--set model.stack.n_layers=1 --set model.stack.d_model=64 --set model.stack.n_heads=2 \
      --set model.stack.d_ff=64)
  fi
  # TORCH_LOGS=recompiles: each recompilation and the guard behind it, in WORK/NAME.log (how the H200's
  # Multi30k run was found to compile three graphs)
  phase "$name" "$limit" env TORCH_LOGS=recompiles $A train "$config" --out "$RUNS/$name" "$@" "${sets[@]}" &&
    [ -f "$RUNS/$name/metrics.jsonl" ] && cp "$RUNS/$name/metrics.jsonl" "$WORK/$name.metrics.jsonl"
}
recipe shakespeare 150 recipes/gpu/shakespeare_char.yaml
# the same, its steps replayed as CUDA graphs (train.compile: graphs): tokens/s against the line above's
recipe shakespeare_graphs 90 recipes/gpu/shakespeare_char.yaml --set train.compile=graphs --set train.max_steps=1000
# Multi30k with the model of configs/multi30k_de_en.yaml, 3,000 steps (its best validation loss came at
# 2,500 on an H200, where the base and Transformer-Tiny models it replaced did worse: docs/results/translation.md)
recipe multi30k 240 recipes/gpu/multi30k_de_en.yaml
[ -d "$RUNS/multi30k" ] && phase multi30k_bleu 40 $A evaluate "$RUNS/multi30k" --device "$DEVICE" \
  --src data/multi30k/val.de --ref data/multi30k/val.en --json
# SST-2: masked-LM pre-training of BERT-small on every English text here, then fine-tuning
phase sst2_text 10 bash -c "cut -f1 data/sst2/train.tsv > $RUNS/sst2-unlabelled.txt &&
  cat data/multi30k/train.en data/tiny_shakespeare/input.txt >> $RUNS/sst2-unlabelled.txt"
recipe sst2_mlm 540 recipes/gpu/sst2_pretrain.yaml --set "data.train=$RUNS/sst2-unlabelled.txt"
[ -d "$RUNS/sst2_mlm" ] && recipe sst2 150 recipes/gpu/sst2_finetune.yaml --set "train.init_from=$RUNS/sst2_mlm"
# Transformer-XL against the same model without memory, at nanoGPT's budget
recipe xl 200 recipes/gpu/shakespeare_xl.yaml
recipe xl_nomem 200 recipes/gpu/shakespeare_xl.yaml --set model.memory_length=0
# Mask-Predict distilled from the Multi30k run: its beam-4 translations of the training sources, the
# conditional masked LM trained on them, BLEU at 1 and 10 iterations (recipes/mask_predict/distill.sh's chain)
if [ -d "$RUNS/multi30k" ]; then
  mkdir -p "$RUNS/distil" && cp data/multi30k/train.de "$RUNS/distil/train.de"
  [ "$DEVICE" = cpu ] && head -n 20 data/multi30k/train.de >"$RUNS/distil/train.de"  # a check of the chain
  phase distil 120 $A translate "$RUNS/multi30k" --device "$DEVICE" --beam 4 --input "$RUNS/distil/train.de" \
    --output "$RUNS/distil/train.en" --force
  [ -s "$RUNS/distil/train.en" ] && recipe cmlm 340 recipes/gpu/multi30k_cmlm.yaml --set "data.train=$RUNS/distil/train"
  for T in 1 10; do
    [ -d "$RUNS/cmlm" ] && phase "cmlm_bleu_$T" 40 $A evaluate "$RUNS/cmlm" --device "$DEVICE" --iterations "$T" \
      --length-beam 5 --src data/multi30k/val.de --ref data/multi30k/val.en --json
  done
fi
tar -czf "$OUT/records.tgz" -C "$WORK" .
[ -n "$PYTEST" ] && grep -h -E "FAILED|ERROR|[0-9]+ (passed|failed|skipped)" "$WORK/pytest_cuda.jsonl" 2>/dev/null | tail -40 >>"$OUT/summary.txt"
say "done after $((SECONDS - START)) s"
