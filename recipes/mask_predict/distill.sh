#!/usr/bin/env bash
# Mask-Predict on Multi30k de -> en with sequence-level knowledge distillation (Kim & Rush 2016),
# as Ghazvininejad et al. (2019) train their models:
#   1. train the autoregressive Transformer (configs/multi30k_de_en.yaml);
#   2. translate the training sources with it, beam 4: the distilled targets;
#   3. train the conditional masked LM on (sources, distilled targets) (multi30k_cmlm.yaml);
#   4. BLEU on the validation set at T = 1, 2, 4 and 10 mask-predict iterations, length beam 5.
# Run from the repository root after `attnlab data get multi30k` (or DATA=DIR with train.{de,en}
# and val.{de,en}). Runs go under WORK (default runs/mask_predict); an existing run is refused.
# AR_CONFIG and CMLM_CONFIG name the two training configs (default: the CPU-sized preset and
# multi30k_cmlm.yaml beside this script; recipes/gpu/ has a GPU-sized pair).
set -euo pipefail

ATTNLAB=${ATTNLAB:-.venv/bin/attnlab}
DATA=${DATA:-data/multi30k}
WORK=${WORK:-runs/mask_predict}
AR_CONFIG=${AR_CONFIG:-configs/multi30k_de_en.yaml}
CMLM_CONFIG=${CMLM_CONFIG:-$(dirname "$0")/multi30k_cmlm.yaml}

mkdir -p "$WORK/distil"
"$ATTNLAB" train "$AR_CONFIG" --set data.train="$DATA/train" --set data.valid="$DATA/val" \
    --out "$WORK/ar"
"$ATTNLAB" translate "$WORK/ar" --beam 4 --input "$DATA/train.de" --output "$WORK/distil/train.en"
cp "$DATA/train.de" "$WORK/distil/train.de"
"$ATTNLAB" train "$CMLM_CONFIG" --set data.train="$WORK/distil/train" --set data.valid="$DATA/val" \
    --out "$WORK/cmlm"
for T in 1 2 4 10; do
    echo "== mask-predict, $T iterations, length beam 5"
    "$ATTNLAB" evaluate "$WORK/cmlm" --src "$DATA/val.de" --ref "$DATA/val.en" --iterations "$T" --length-beam 5
done
