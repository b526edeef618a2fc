"""`attnlab export-hf` of vit runs as Hugging Face ViT: a tiny random ViTForImageClassification / ViTModel
(every parameter perturbed) imported and exported again, and a tiny ViT trained by attnlab on the
digits (recipes/digits/vit.yaml shrunk, ``classifier.head: linear``, learned 1-D positions), load in
transformers (AutoModelForImageClassification / AutoModel) and compute what the originals compute
(max abs difference <= 1e-5); the exported ViTImageProcessor gives the pixels attnlab reads (its
size, bilinear resize and standardisation); options ViT lacks are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml
from PIL import Image
from test_hf_vit import tiny_folder

from attnlab.config import overlaid
from attnlab.data.images import digits
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.image_classification import read_inputs

from helpers import run_cli

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "digits" / "vit.yaml"
SHRUNK = (
    "model.patches.positional=learned",
    "model.classifier.head=linear",
    "model.stack.d_model=16",
    "model.stack.n_heads=2",
    "model.stack.n_layers=2",
    "model.stack.d_ff=32",
    "model.stack.activation=gelu_tanh",
    "train.max_steps=20",
    "train.eval_every=20",
)


def export(run: Path, out: Path):
    return run_cli("export-hf", str(run), "--out", str(out))


@pytest.mark.parametrize("head, size", [(True, 16), (False, 16), (True, [16, 8])])
def test_a_vit_imported_then_exported_is_the_same_model(tmp_path, head, size):
    original = tiny_folder(tmp_path / "hf", head=head, image_size=size)
    done = run_cli("import-hf", str(original), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    done = export(tmp_path / "run", tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    assert "(config.json, model.safetensors, preprocessor_config.json)" in done.stdout
    auto = transformers.AutoModelForImageClassification if head else transformers.AutoModel
    assert transformers.AutoConfig.from_pretrained(tmp_path / "exported").architectures == [
        "ViTForImageClassification" if head else "ViTModel"
    ]
    theirs, ours = (
        auto.from_pretrained(folder, attn_implementation="eager").eval() for folder in (original, tmp_path / "exported")
    )
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["image_size"] == size
    height, width = (size, size) if isinstance(size, int) else size
    images = torch.randn(4, 3, height, width, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = (m(pixel_values=images, output_hidden_states=True) for m in (theirs, ours))
    diff = {"hidden": (a.hidden_states[-1] - b.hidden_states[-1]).abs().max().item()}
    diff |= (
        {"logits": (a.logits - b.logits).abs().max().item()}
        if head
        else {"pooled": (a.pooler_output - b.pooler_output).abs().max().item()}
    )
    assert max(diff.values()) <= 1e-5, diff
    processors = [transformers.ViTImageProcessor.from_pretrained(f) for f in (original, tmp_path / "exported")]
    assert np.allclose(processors[0].image_mean, processors[1].image_mean, atol=1e-7)
    assert np.allclose(processors[0].image_std, processors[1].image_std, atol=1e-7)
    assert (processors[1].size["height"], processors[1].size["width"]) == (height, width)
    if head:
        assert ours.config.id2label == theirs.config.id2label


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    sets = [arg for pair in SHRUNK for arg in ("--set", pair)]
    done = run_cli("train", str(RECIPE), "--out", str(root / "run"), *sets)
    assert done.returncode == 0, done.stderr
    return root / "run"


def test_a_trained_vit_exports_and_transformers_gives_its_logits_on_image_files(digits_run, tmp_path):
    done = export(digits_run, tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert (config["hidden_act"], config["num_channels"], config["image_size"], config["patch_size"]) == (
        "gelu_new",
        1,
        8,
        2,
    )
    images, _ = digits(0)["test"]
    paths = []
    for i in range(4):  # four test digits as 8x8 greyscale PNGs, and one 12x10 image that both resize to 8x8
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(np.rint(images[i, :, :, 0]).astype(np.uint8), mode="L").save(paths[-1])
    paths.append(tmp_path / "large.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (12, 10), dtype=np.uint8), mode="L").save(paths[-1])
    pixels = read_inputs([str(p) for p in paths], RunDir(digits_run))  # (5, 1, 8, 8), as `predict` reads them
    processor = transformers.ViTImageProcessor.from_pretrained(tmp_path / "exported")
    theirs_pixels = processor([Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
    assert (pixels - theirs_pixels).abs().max().item() <= 1e-5
    model, _, _ = load_run(digits_run)
    hf = transformers.AutoModelForImageClassification.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        ours, theirs = model.eval().classify(pixels), hf(pixel_values=theirs_pixels).logits
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert hf.config.id2label == {i: str(i) for i in range(10)}


@pytest.mark.parametrize(
    "changes, named",
    [
        (
            {"patches": {"positional": "learned_2d"}, "classifier": {"head": "pooled"}},
            "patches.positional 'learned_2d' (ViT's is 'learned'); classifier.head 'pooled' (ViTForImageClassification's is 'linear')",
        ),
        ({"patches": {"positional": "sinusoidal_2d"}}, "patches.positional 'sinusoidal_2d' (ViT's is 'learned')"),
        (
            {"patches": {"positional": "none"}, "classifier": {"pooling": "mean"}},
            "patches.positional 'none' (ViT's is 'learned'); classifier.pooling 'mean' (ViT's is 'cls')",
        ),
        ({"stack": {"norm": "post"}}, "stack.norm 'post' (ViT's is 'pre')"),
        ({}, "pruned heads (ViT has num_attention_heads in every layer)"),
    ],
)
def test_an_export_of_options_vit_lacks_names_them_in_one_line(digits_run, tmp_path, changes, named):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "task_state.json"):
        (run / name).write_text((digits_run / name).read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = overlaid(config["model"], changes)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    if not changes:
        (run / "pruned_heads.json").write_text(json.dumps({"encoder.layers.0.self_attn": [1]}))
    done = export(run, tmp_path / "exported")
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == f"error: {run}: ViT has no counterpart for {named}\n"
    assert not (tmp_path / "exported").exists()
