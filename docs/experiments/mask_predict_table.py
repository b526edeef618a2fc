"""docs/results/decoding.md's Mask-Predict table: validation BLEU and sentences/s of an autoregressive run
(greedy and beam 4) and of conditional masked LMs (mask-predict at T = 1, 2, 4, 10 iterations,
length beam 5), each timed over the whole set in this process, one after another.

    .venv/bin/python docs/experiments/mask_predict_table.py runs/m30 runs/cmlm-raw runs/cmlm-distil \
        --src data/multi30k/val.de --ref data/multi30k/val.en [--length-beam 1] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from attnlab.data.corpora import read_lines
from attnlab.decode.spec import Beam, Greedy, MaskPredict, Search
from attnlab.decode.translate import translate
from attnlab.eval.metrics import corpus_bleu
from attnlab.runs.checkpoint import load_run


def row(name: str, model, tokenizers, sources: list[str], references: list[str], search: Search) -> str:
    """One line of the table: BLEU, and the sentences per second of the decoding alone."""
    started = time.perf_counter()
    hypotheses = [nbest[0][0] for nbest in translate(model, tokenizers, sources, search)]
    seconds = time.perf_counter() - started
    return f"| {name} | {corpus_bleu(hypotheses, references)[0]:.2f} | {len(sources) / seconds:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("autoregressive")
    parser.add_argument("cmlm", nargs="+")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--iterations", type=int, nargs="+", default=[1, 2, 4, 10])
    parser.add_argument("--length-beam", type=int, default=5)
    parser.add_argument(
        "--batch-size", type=int, default=64, help="sentences decoded together (translate's default 64)"
    )
    args = parser.parse_args()
    sources, references = read_lines(args.src), read_lines(args.ref)
    print(f"torch threads: {torch.get_num_threads()}; {len(sources)} sentences, batches of {args.batch_size}")
    print("| model and search | BLEU | sentences/s |\n|---|---|---|")
    with torch.no_grad():
        model, tokenizers, _ = load_run(args.autoregressive)
        searches = {"greedy": Greedy(batch_size=args.batch_size), "beam 4": Beam(batch_size=args.batch_size)}
        for name, search in searches.items():
            print(row(f"{args.autoregressive}, {name}", model, tokenizers, sources, references, search), flush=True)
        for run in args.cmlm:
            model, tokenizers, _ = load_run(run)
            for t in args.iterations:
                print(
                    row(
                        f"{run}, T = {t}, length beam {args.length_beam}",
                        model,
                        tokenizers,
                        sources,
                        references,
                        MaskPredict(iterations=t, length_beam=args.length_beam, batch_size=args.batch_size),
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
