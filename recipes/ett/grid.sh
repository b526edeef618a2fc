#!/usr/bin/env bash
# The validation table of docs/results/time_series.md: the three recipes of this folder (last_value, dlinear,
# patchtst) at horizons 96, 192, 336 and 720, on ETTh1 and ETTh2 (the whole files in data/ett, from
# `attnlab data get ett`), each trained with `attnlab train` and scored on its validation months by
# `attnlab evaluate --split valid` (the best checkpoint). Run from the repository root:
#   bash recipes/ett/grid.sh [OUT]        (default OUT: runs/ett; a run with a summary.json is kept)
# It prints a Markdown table of validation MSE / MAE and the training seconds of each run.
set -euo pipefail
out=${1:-runs/ett}
mkdir -p "$out"
attnlab=${ATTNLAB:-.venv/bin/attnlab}
for data in ETTh1 ETTh2; do
  for model in last_value dlinear patchtst; do
    for horizon in 96 192 336 720; do
      run="$out/$data-$model-$horizon"
      if [ ! -f "$run/summary.json" ]; then
        "$attnlab" train "recipes/ett/$model.yaml" --out "$run" \
          --set "data.path=data/ett/${data}.csv" --set "data.horizon=$horizon" >"$run.log" 2>&1
      fi
      "$attnlab" evaluate "$run" --split valid --json >"$run/valid.json"
    done
  done
done
"${PYTHON:-.venv/bin/python}" - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("| data | model | " + " | ".join(f"h {h}: MSE / MAE" for h in (96, 192, 336, 720)) + " | training (s) |")
print("|---|---|---|---|---|---|---|")
for data in ("ETTh1", "ETTh2"):
    for model in ("last_value", "dlinear", "patchtst"):
        cells, seconds = [], []
        for h in (96, 192, 336, 720):
            run = out / f"{data}-{model}-{h}"
            valid = json.loads((run / "valid.json").read_text())
            cells.append(f"{valid['mse']:.3f} / {valid['mae']:.3f}")
            seconds.append(f"{json.loads((run / 'summary.json').read_text())['train_seconds']:.0f}")
        print(f"| {data} | {model} | " + " | ".join(cells) + " | " + ", ".join(seconds) + " |")
PY
