"""Golden figures: what attnlab computes today, recorded so that a refactoring can show it changed
nothing (tests/test_golden.py compares them; issue 16).

- ``preset_losses``: the first 20 training losses (log_every 1) of every training preset in configs/,
  in fp32 on the CPU, with the preset's model and train settings. Presets that read files get small
  files written here instead (``synthetic_data``): pairs and text from attnlab's SCAN grammar, so
  the test needs no shared data; max_tokens is cut to 200 to keep the suite quick.
- ``decodes``: greedy and beam-4 outputs of tests/golden/scan_run, a small SCAN run directory
  written by the release before the refactoring (so it also shows that old run directories load).
- ``info``: `attnlab info --json` of transformer_base and transformer_big.

Record (only when the behaviour is meant to change, and say so in the commit):
    python tests/golden.py            writes tests/golden/figures.json
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIGURES = HERE / "golden" / "figures.json"
SCAN_RUN = HERE / "golden" / "scan_run"
STEPS = 20
# Test commands for the SCAN run: every 97th of the grammar's 20,910, 50 in all.
N_COMMANDS = 50


def training_presets() -> list[Path]:
    """configs/*.yaml with a train section (the others describe a model only)."""
    import yaml

    return [p for p in sorted((ROOT / "configs").glob("*.yaml")) if "train" in yaml.safe_load(p.read_text())]


def synthetic_data(folder: Path) -> dict[str, list[str]]:
    """Small files in every format the presets read, from the SCAN grammar with a fixed shuffle;
    returns the --set overrides of the data paths, by format."""
    from attnlab.data.scan import scan_commands

    pairs = scan_commands()
    random.Random(0).shuffle(pairs)
    train, valid = pairs[:400], pairs[400:440]
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("val", valid)):
        (folder / f"{name}.de").write_text("".join(f"{s}\n" for s, _ in part))
        (folder / f"{name}.en").write_text("".join(f"{t}\n" for _, t in part))
    (folder / "scan_train.txt").write_text("".join(f"IN: {s} OUT: {t}\n" for s, t in train))
    (folder / "scan_test.txt").write_text("".join(f"IN: {s} OUT: {t}\n" for s, t in valid))
    (folder / "text.txt").write_text("".join(f"{s} . {t} .\n" for s, t in train))
    return {"parallel": [f"data.train={folder}/train", f"data.valid={folder}/val"],
            "scan": [f"data.train={folder}/scan_train.txt", f"data.test={folder}/scan_test.txt", "data.n_valid=40"],
            "text": [f"data.train={folder}/text.txt"], "builtin": []}


def train_losses(preset: Path, data_sets: dict[str, list[str]], out: Path, device: str = "cpu",
                 sets: Sequence[str] = ()) -> list[float]:
    """The first STEPS training losses of ``preset``, trained by `attnlab train` into ``out`` on the
    files of ``data_sets`` (through the command line, the interface a refactoring keeps), on ``device``,
    with the --set overrides ``sets`` besides."""
    import yaml

    fmt = yaml.safe_load(preset.read_text())["data"].get("format", "builtin")
    # evaluation does not change the training losses: one quick evaluation at the end, no decoding
    overrides = [*data_sets[fmt], f"train.max_steps={STEPS}", "train.log_every=1", f"train.eval_every={STEPS}",
                 "train.max_tokens=200", "train.precision=fp32", f"train.device={device}", "train.progress=false",
                 "train.eval_exact_match=0", "train.early_stop_metric=valid_loss", *sets]
    done = cli("train", str(preset), "--out", str(out), *(arg for o in overrides for arg in ("--set", o)))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def preset_losses(folder: Path) -> dict[str, list[float]]:
    data_sets = synthetic_data(folder / "data")
    return {preset.name: train_losses(preset, data_sets, folder / "runs" / preset.stem)
            for preset in training_presets()}


def scan_commands_for_decoding() -> list[str]:
    from attnlab.data.scan import scan_commands

    return [command for command, _ in scan_commands()[::97][:N_COMMANDS]]


def decodes() -> dict[str, list[str]]:
    commands = "".join(f"{c}\n" for c in scan_commands_for_decoding())
    outputs = {}
    for beam in (1, 4):
        done = cli("translate", str(SCAN_RUN), "--beam", str(beam), stdin=commands)
        assert done.returncode == 0, done.stderr
        outputs[f"beam{beam}"] = done.stdout.splitlines()
    return outputs


def info() -> dict[str, dict]:
    reports = {}
    for name in ("transformer_base.yaml", "transformer_big.yaml"):
        done = cli("info", str(ROOT / "configs" / name), "--json")
        assert done.returncode == 0, done.stderr
        reports[name] = {k: v for k, v in json.loads(done.stdout).items() if k != "config"}  # (the path given)
    return reports


def cli(*args: str, stdin: str = ""):
    sys.path.insert(0, str(HERE))
    from helpers import run_cli

    return run_cli(*args, stdin=stdin)


def figures(folder: Path) -> dict:
    return {"preset_losses": preset_losses(folder), "decodes": decodes(), "info": info()}


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        FIGURES.write_text(json.dumps(figures(Path(tmp)), indent=1) + "\n")
    print(f"wrote {FIGURES}")
