"""The validation loss of trained weights read as Transformer-XL reads (docs/results/transformer_xl.md): the
validation text of the Tiny Shakespeare XL run cut into 12 rows of consecutive 64-token segments,
each read after a memory of M positions, for the weights of several runs. The decoder-only runs'
weights load into a Transformer-XL of the same sizes (same parameter names), so the plain model
can be read with a memory it never trained with, and the XL model with a memory of another length.

    .venv/bin/python docs/experiments/xl_memory_eval.py runs/xl-seg64-mem64 \\
        runs/xl-seg64-mem64:0,64,128,192 runs/xl-seg64-mem0:0,64 runs/xl-rotary-block64:0,64
"""

import dataclasses
import sys

import torch

from attnlab.data.batching import lm_segments
from attnlab.models import build_model
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir


def main(xl_run: str, cells: list[str]) -> None:
    run = RunDir(xl_run)
    config, data_config, train_config = run.read_config()
    valid = read_run_data(run, "valid").splits["valid"]
    batches = lm_segments(valid, data_config.windows.block_size, train_config.batch_size)
    print("| weights of | memory at evaluation | validation loss |\n|---|---|---|")
    for cell in cells:
        weights, memories = cell.split(":")
        trained, _, _ = load_run(weights)
        for memory in map(int, memories.split(",")):
            model = build_model(dataclasses.replace(config, memory_length=memory)).eval()
            model.load_state_dict(trained.state_dict())
            nll = data_config.task.segments_nll(model, batches, torch.device("cpu"))
            print(f"| {weights} | {memory} | {nll['loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
