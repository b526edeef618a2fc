"""How encoding the source in overlapping chunks changes a model's output (docs/results/decoding.md ("Encoding the source in overlapping chunks")).

The run of ``recipes/extrapolation/reverse.yaml`` (sinusoidal positions; reversing 1-20 symbols,
a task where every output token depends on a far input position) decodes its validation split
greedily with the source encoded whole, then in chunks of each size and overlap (nn/chunks.py:
windows encoded alone, positions numbered from 0 in each, every position's vector from the window
where it has the most context). Prints the exact match of each setting as Markdown.

    .venv/bin/python docs/experiments/chunked_encoding.py runs/extrapolation/scheme=sinusoidal/seed1
"""

import sys
from pathlib import Path

from attnlab.nn.chunks import Chunking, chunked_encoding
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.translation import decode_split

SETTINGS = [(None, 0), (16, 0), (16, 4), (16, 8), (8, 0), (8, 2), (8, 4), (4, 0), (4, 2)]


def exact_match(model, data) -> float:
    triples = decode_split(model, data, "valid")
    return sum(hyp == ref for _, ref, hyp in triples) / len(triples)


def main(run: Path) -> None:
    model, _, _ = load_run(run)
    data = read_run_data(RunDir(run))
    lengths = [len(e.src_ids) for e in data.splits["valid"]]
    print(f"validation: {len(lengths)} sequences of {min(lengths)}-{max(lengths)} symbols (+ EOS)\n")
    print("| chunk size | overlap | exact match |")
    print("|---|---|---|")
    for size, overlap in SETTINGS:
        if size is None:
            print(f"| whole input | - | {100 * exact_match(model, data):.1f}% |")
            continue
        with chunked_encoding(model, Chunking(size, overlap)):
            print(f"| {size} | {overlap} | {100 * exact_match(model, data):.1f}% |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
