"""`attnlab import-hf` of ViT: a tiny random ViTForImageClassification (2 layers, d 32, 16x16 RGB
images of 4x4 patches, every LayerNorm and bias perturbed, its own image_mean/std) becomes a vit run
whose hidden states and logits equal transformers' (float32, max abs difference <= 1e-5), whose
`predict` on a PNG gives transformers' argmax on the same pixels, and whose standardised pixels
equal ViTImageProcessor's; a ViTModel (no classifier) becomes an image_encoder run that `inspect`
reads and `predict` refuses; options attnlab's vit cannot represent are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from attnlab.data.images import read_image
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.image_classification import read_inputs

from helpers import run_cli

LABELS = {0: "cat", 1: "dog", 2: "bird", 3: "fish"}
MEAN, STD = [0.45, 0.5, 0.55], [0.2, 0.25, 0.3]


def tiny_folder(path: Path, head: bool = True, seed: int = 0, **overrides) -> Path:
    """A random ViTForImageClassification (or, ``head=False``, ViTModel with its pooler) saved as
    transformers saves it, with a preprocessor_config.json of its own mean and std."""
    config = transformers.ViTConfig(
        **{
            "image_size": 16,
            "patch_size": 4,
            "num_channels": 3,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "id2label": LABELS,
            "label2id": {v: k for k, v in LABELS.items()},
        }
        | overrides
    )
    torch.manual_seed(seed)
    model = (transformers.ViTForImageClassification(config) if head else transformers.ViTModel(config)).eval()
    with torch.no_grad():  # the initial LayerNorms and biases are 1 and 0: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    transformers.ViTImageProcessor(image_mean=MEAN, image_std=STD, size={"height": 16, "width": 16}).save_pretrained(
        path
    )
    return path


def reference(folder: Path, head: bool = True):
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    return cls.from_pretrained(folder, attn_implementation="eager").eval()


def imported(tmp_path: Path, folder: Path, task: str, commands: str):
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert (
        f"a run of data.task '{task}'; its commands: {commands}, and train.init_from to fine-tune it"
        in done.stdout.splitlines()
    ), done.stdout
    model, _, cfg = load_run(tmp_path / "run")
    return model.eval(), cfg


def test_states_and_logits_equal_transformers(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    model, cfg = imported(tmp_path, folder, "image_classification", "predict, evaluate, inspect")
    assert (cfg.classifier.head, cfg.stack.layer_norm_eps, cfg.stack.activation, cfg.stack.norm) == (
        "linear",
        1e-12,
        "gelu",
        "pre",
    )
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = reference(folder)(pixel_values=images, output_hidden_states=True)
        hidden = (
            (model.encode(images) - reference(folder).vit(pixel_values=images).last_hidden_state).abs().max().item()
        )
        logits = (model.classify(images) - theirs.logits).abs().max().item()
    assert hidden <= 1e-5 and logits <= 1e-5, (hidden, logits)
    init = json.loads((tmp_path / "run" / "init.json").read_text())
    assert init["new"] == [] and init["unused"] == [] and init["untrained"] == []


def test_predict_gives_transformers_argmax_on_a_png_with_the_processors_pixels(tmp_path):
    folder = tiny_folder(tmp_path / "hf", seed=3)
    imported(tmp_path, folder, "image_classification", "predict, evaluate, inspect")
    rng = np.random.default_rng(0)
    png = tmp_path / "photo.png"
    Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8), mode="RGB").save(png)  # resized to 16x16
    run = RunDir(tmp_path / "run")
    pixels = read_inputs([str(png)], run)  # (1, 3, 16, 16): attnlab's resize and standardisation
    resized = read_image(png, "rgb", 16).astype(np.uint8)  # the same bilinear resize, as 0-255 pixels
    processor = transformers.ViTImageProcessor.from_pretrained(folder)
    theirs_pixels = processor(Image.fromarray(resized), do_resize=False, return_tensors="pt")["pixel_values"]
    assert (pixels - theirs_pixels).abs().max().item() <= 1e-5
    with torch.no_grad():
        logits = reference(folder)(pixel_values=pixels).logits[0]
    done = run_cli("predict", str(tmp_path / "run"), str(png), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["label"] == LABELS[int(logits.argmax())]
    assert list(answer["probabilities"]) == list(LABELS.values())
    assert torch.allclose(torch.tensor(list(answer["probabilities"].values())), logits.softmax(-1), atol=1e-5)


def test_without_a_preprocessor_config_the_pixels_are_vit_image_processors_defaults(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    (folder / "preprocessor_config.json").unlink()
    imported(tmp_path, folder, "image_classification", "predict, evaluate, inspect")
    state = RunDir(tmp_path / "run").read_task_state()
    defaults = transformers.ViTImageProcessor()
    assert np.allclose(state["mean"], np.array(defaults.image_mean) / defaults.rescale_factor)
    assert np.allclose(state["std"], np.array(defaults.image_std) / defaults.rescale_factor)
    assert state["shape"] == [16, 16, 3] and state["labels"] == list(LABELS.values())


def test_a_vit_model_is_an_image_encoder_run_that_inspect_reads_and_predict_refuses(tmp_path):
    folder = tiny_folder(tmp_path / "hf", head=False)
    model, cfg = imported(tmp_path, folder, "image_encoder", "inspect")
    assert cfg.classifier.head == "pooled"
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = reference(folder, head=False)(pixel_values=images)
        states = model.encode(images)
        pooled = torch.tanh(model.classifier.pool(states[:, 0]))
    assert (states - theirs.last_hidden_state).abs().max().item() <= 1e-5
    assert (pooled - theirs.pooler_output).abs().max().item() <= 1e-5
    init = json.loads((tmp_path / "run" / "init.json").read_text())
    assert init["untrained"] == ["classifier.out.weight", "classifier.out.bias"]
    png = tmp_path / "photo.png"
    Image.fromarray(np.full((16, 16, 3), 128, dtype=np.uint8), mode="RGB").save(png)
    refused = run_cli("predict", str(tmp_path / "run"), str(png))
    assert refused.returncode != 0 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "'image_encoder'" in refused.stderr and "predict" in refused.stderr
    done = run_cli("inspect", str(tmp_path / "run"), "--src", str(png), "--out", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig" / "rollout.png").is_file()


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"hidden_act": "relu"}, "hidden_act 'relu' (attnlab's ViT has 'gelu', the exact one)"),
        ({"qkv_bias": False}, "qkv_bias false"),
        ({"patch_size": [4, 8]}, "patch_size [4, 8] (attnlab's patches are square)"),
        ({"pooler_act": "relu"}, "pooler_act 'relu'"),
    ],
)
def test_options_attnlab_cannot_represent_are_refused_in_one_line(tmp_path, overrides, named):
    folder = tiny_folder(tmp_path / "hf", **overrides)
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert named in done.stderr and "not representable in attnlab's vit" in done.stderr
    assert not (tmp_path / "run").exists()


def test_encoder_stride_is_ignored_and_a_layer_norm_eps_is_kept(tmp_path):
    folder = tiny_folder(tmp_path / "hf", encoder_stride=3, layer_norm_eps=1e-5)
    model, cfg = imported(tmp_path, folder, "image_classification", "predict, evaluate, inspect")
    assert cfg.stack.layer_norm_eps == 1e-5
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (model.classify(images) - reference(folder)(pixel_values=images).logits).abs().max().item() <= 1e-5


def test_the_explorer_serves_an_imported_vit_on_an_image_file(tmp_path):
    """`attnlab serve --allow-files` takes the imported run like any other: every layer's attention
    maps, and as most probable class the label `predict` gives."""
    from attnlab.serve.explorer import Explorer

    folder = tiny_folder(tmp_path / "hf")
    imported(tmp_path, folder, "image_classification", "predict, evaluate, inspect")
    png = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8), mode="RGB").save(png)
    served = Explorer(tmp_path / "run", allow_files=True).run({"text": str(png)})
    assert served["task"] == "image_classification" and len(served["attention"]) == 2
    done = run_cli("predict", str(tmp_path / "run"), str(png), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["label"] == served["outputs"][0]["label"]
