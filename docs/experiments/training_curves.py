"""A run's training curves as a figure: the training loss of each log line and the validation loss of
each evaluation against the optimizer step, read from the run's metrics.jsonl, the best step marked
(docs/figures/, the tutorials). TensorBoard shows the same curves live (`tensorboard --logdir RUN`);
this draws them once, for a page.

    .venv/bin/python docs/experiments/training_curves.py RUN OUT.png [TITLE]
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnlab.runs.run_dir import RunDir  # noqa: E402


def curves(run: RunDir) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, training loss) of every train line, (step, validation loss) of every evaluation."""
    records = [json.loads(line) for line in run.metrics.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    valid = [(r["step"], r["valid_loss"]) for r in records if r["split"] == "valid" and "valid_loss" in r]
    return train, valid


def main(path: Path, out: Path, title: str) -> None:
    run = RunDir(path)
    train, valid = curves(run)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(*zip(*train), label="training loss (each log line)", color="tab:blue", linewidth=1)
    ax.plot(*zip(*valid), label="validation loss (each evaluation)", color="tab:orange", marker="o", markersize=3)
    best = run.best_step()
    if best is not None:
        ax.axvline(best, color="grey", linestyle=":", label=f"best checkpoint (step {best})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"{out}: {len(train)} training points, {len(valid)} evaluations, best step {best}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else sys.argv[1])
