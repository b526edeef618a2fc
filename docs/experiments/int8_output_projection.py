"""int8 weights with and without the output projection (docs/results/decoding.md, "Multi30k with int8 and
bf16 weights"): validation BLEU of a trained run, and greedy decoding speed on the model of
`attnlab bench decode` (batch 32, 64 new tokens), for fp32, int8 on every linear layer (what
`--weights int8` did at first) and int8 on every linear layer but the generator (what it does now,
decode/weights.py).

    .venv/bin/python docs/experiments/int8_output_projection.py runs/m30 \
        --src data/multi30k/val.de --ref data/multi30k/val.en
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch import nn

from attnlab.bench.decode import decode_inputs
from attnlab.bench.timing import interleaved_medians
from attnlab.data.corpora import read_lines
from attnlab.decode.search import greedy
from attnlab.decode.spec import Beam, Greedy
from attnlab.decode.weights import _quiet
from attnlab.eval.evaluate import evaluate
from attnlab.runs.checkpoint import load_run


def int8(model: nn.Module, keep: tuple[str, ...]) -> nn.Module:
    """A copy of ``model`` with every linear layer but those named in ``keep`` quantised as
    decode/weights.py quantises them (dynamic, per output channel)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    layers = {
        name: per_channel_dynamic_qconfig
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name not in keep
    }
    with _quiet():
        return quantize_dynamic(copy.deepcopy(model), layers, dtype=torch.qint8)


def variants(model: nn.Module) -> dict[str, nn.Module]:
    return {
        "fp32": model,
        "int8, every linear layer": int8(model, ()),
        "int8, the generator in fp32": int8(model, ("generator",)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sources, references = read_lines(args.src), read_lines(args.ref)
    model, tokenizers, _ = load_run(args.run)
    with torch.no_grad():
        for name, variant in variants(model).items():
            bleu = {
                beam: evaluate(variant, tokenizers, sources, references, search)["bleu"]
                for beam, search in ((4, Beam()), (1, Greedy()))
            }
            print(f"{name}: BLEU beam 4 {bleu[4]:.2f}, greedy {bleu[1]:.2f}", flush=True)
        bench, src = decode_inputs(32, 24, 0)
        runs = {
            name: (lambda m: lambda: greedy(m, src, max_len=64, min_len=64))(m) for name, m in variants(bench).items()
        }
        seconds = interleaved_medians(runs, args.repeats, warmup=1)
    print(f"greedy decoding, batch 32 x 64 new tokens, {torch.get_num_threads()} threads, median of {args.repeats}:")
    for name, t in seconds.items():
        print(f"  {name}: {32 * 64 / t:,.0f} tokens/s, x{seconds['fp32'] / t:.2f} fp32")


if __name__ == "__main__":
    main()
