"""How many draft tokens the character LMs accept (docs/performance/targets.md, issue 21).

Greedy speculative decoding of 10 prompts from the validation tenth of Tiny Shakespeare (8
characters every 5,000, continued to the models' 64 positions), for each target run, each draft (a
smaller run, and the target's own multi-token heads where it has them) and each k. Acceptance
depends on the weights, not on the machine's load, so this needs no quiet CPU; the speed is
`attnlab bench lm --run ...`'s. Prints a Markdown table.

    .venv/bin/python docs/experiments/speculation_acceptance.py runs/shakespeare-small \
        runs/shakespeare runs/shakespeare-mtp runs/shakespeare-mtp-w03
"""

import sys

import torch

from attnlab.decode.speculative import SpeculationStats, speculative_decode
from attnlab.runs.checkpoint import load_run

TEXT = "data/tiny_shakespeare/input.txt"
POSITIONS = 64


def prompts() -> list[str]:
    text = open(TEXT).read()
    valid = text[int(len(text) * 0.9) :]
    return [valid[i : i + 8] for i in range(0, 50_000, 5_000)]


def acceptance(target, draft, tokenizer, k: int) -> SpeculationStats:
    total = SpeculationStats()
    for prompt in prompts():
        ids = torch.tensor([tokenizer.encode(prompt)])
        total.add(
            speculative_decode(
                target, draft, prompt=ids, k=k, max_new_tokens=POSITIONS - ids.shape[1], stop_at_eos=False
            )[1]
        )
    return total


def main(small_run: str, targets: list[str]) -> None:
    small = load_run(small_run)[0]
    print("| target | draft | k | accepted | tokens a pass of the target |\n|---|---|---|---|---|")
    for run in targets:
        model, tokenizers, _ = load_run(run)
        drafts = [(small_run, small, (2, 3, 4, 6))] + ([("its heads", None, (1, 2, 3))] if len(model.heads) else [])
        for name, draft, ks in drafts:
            for k in ks:
                stats = acceptance(model, draft, tokenizers["tgt"], k)
                print(
                    f"| {run} | {name} | {k} | {stats.acceptance_rate:.1%} | {stats.tokens_per_pass:.2f} |", flush=True
                )


if __name__ == "__main__":
    with torch.no_grad():
        main(sys.argv[1], sys.argv[2:])
