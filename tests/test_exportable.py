"""recipes/export/: one recipe per family that `attnlab export-hf` writes (issue 64: no preset exported,
and nothing said which settings do). Each recipe, trained for 2 steps on miniature data in its own
layout, exports, and the folder loads in transformers with the run's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from attnlab.interop.folder import EXPORTERS

from helpers import run_cli

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "export"
WORDS = "a little dog runs over the green grass while two men watch it".split()


def sentences(n: int, shift: int) -> list[str]:
    return [" ".join(WORDS[(i + shift + j) % len(WORDS)] for j in range(3 + i % 5)) for i in range(n)]


def miniature(recipe: Path, root: Path) -> list[str]:
    """Miniature data where the recipe reads its own (data/NAME/...), and the --set lines that point it
    there and shorten the run: 2 steps, a small vocabulary."""
    data = yaml.safe_load(recipe.read_text())["data"]
    sets = ["train.max_steps=2", "train.eval_every=2", "train.warmup_steps=1", "train.warmup_ratio=null"]
    if data.get("format") == "text":
        (root / "input.txt").write_text("\n".join(sentences(200, 0)) + "\n")
        sets += [f"data.train={root / 'input.txt'}", "data.text.vocab_size=300"]
    elif data.get("format") == "parallel":
        for split, n in (("train", 120), ("val", 20)):
            (root / f"{split}.de").write_text("\n".join(sentences(n, 1)) + "\n")
            (root / f"{split}.en").write_text("\n".join(sentences(n, 2)) + "\n")
        sets += [f"data.train={root / 'train'}", f"data.valid={root / 'val'}", "data.text.vocab_size=40"]
    elif data.get("task") == "speech_recognition":  # test_speech_recognition.py's pips of three digits
        from test_speech_recognition import write_pips

        sets += [f"data.recordings={write_pips(root / 'recordings')}", "data.splits.n_valid=8", "train.batch_size=4"]
    elif data.get("task") == "audio_classification":  # test_audio_classification.py's tones of two digits
        from test_audio_classification import write_tones

        sets += [f"data.recordings={write_tones(root / 'tones', indices=range(5, 12))}", "train.batch_size=4"]
    elif data.get("task") == "classification":
        for split, n in (("train", 120), ("dev", 20)):
            (root / f"{split}.tsv").write_text("".join(f"{s}\t{i % 2}\n" for i, s in enumerate(sentences(n, 3))))
        sets += [f"data.train={root / 'train.tsv'}", f"data.valid={root / 'dev.tsv'}", "data.text.vocab_size=60"]
    return [item for line in sets for item in ("--set", line)]


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_export_recipe_trains_and_exports_a_folder_transformers_loads(recipe, tmp_path):
    done = run_cli("train", str(recipe), "--out", str(tmp_path / "run"), *miniature(recipe, tmp_path))
    assert done.returncode == 0, done.stderr
    exported = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    arch = yaml.safe_load(recipe.read_text())["model"]["arch"]
    assert config["model_type"] == EXPORTERS[arch].model_type
    model = transformers.AutoModel.from_pretrained(tmp_path / "hf")
    assert sum(p.numel() for p in model.parameters()) > 0 and not torch.isnan(next(model.parameters())).any()


def test_every_family_that_exports_has_an_export_recipe():
    archs = {yaml.safe_load(recipe.read_text())["model"]["arch"] for recipe in RECIPES.glob("*.yaml")}
    assert archs == set(EXPORTERS)
