"""The Vision Transformer (arch vit), the small CNN baseline (arch cnn) and image classification:
patches, patch embedding == strided convolution, the 2-D position tables against their formulas,
pooling, attention rollout by hand, the readers and the digits split, bad input in one line, and a
tiny run through train, predict, evaluate and inspect."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from attnlab import ConfigError, DataError, build_model, task_config
from attnlab.analysis.heads import attention_rollout
from attnlab.data.images import digits, read_folder, read_npz, write_example_digits
from attnlab.nn.vision import (
    ClassToken,
    LearnedPatchPositional,
    LearnedRowColumnPositional,
    PatchEmbedding,
    PatchMean,
    SinCos2DPositional,
    patches,
)
from attnlab.runs.checkpoint import load_run

from helpers import run_cli, sized

ROOT = Path(__file__).resolve().parents[1]

VIT = dict(
    arch="vit",
    image_height=8,
    image_width=8,
    channels=1,
    n_classes=10,
    patches=dict(size=2),
    stack=dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0),
)


def test_an_image_is_the_sequence_of_its_patches_in_row_major_order():
    image = torch.arange(16.0).view(1, 1, 4, 4)  # pixel (r, c) = 4r + c
    assert patches(image, 2, 2)[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    two = torch.cat([image, 100 + image], dim=1)  # (1, 2, 4, 4): each patch flattened channel by channel
    assert patches(two, 2, 2)[0, 1].tolist() == [2, 3, 6, 7, 102, 103, 106, 107]
    # overlapping (the AST's): a patch every 2 pixels of 3 x 3, on a 4 x 4 image: (4 - 3) // 2 + 1 = 1 a side;
    # every pixel of 2 x 2 patches every pixel: 3 x 3 of them
    assert patches(image, 3, 2)[0].tolist() == [[0, 1, 2, 4, 5, 6, 8, 9, 10]]
    assert patches(image, 2, 1)[0, :4].tolist() == [[0, 1, 4, 5], [1, 2, 5, 6], [2, 3, 6, 7], [4, 5, 8, 9]]


def test_the_patch_embedding_is_a_strided_convolution_with_the_same_weights():
    torch.manual_seed(0)
    embed = PatchEmbedding(channels=3, patch_size=4, d_model=8)
    images = torch.randn(2, 3, 12, 8)
    conv = F.conv2d(images, embed.projection.weight.view(8, 3, 4, 4), embed.projection.bias, stride=4)  # (2, 8, 3, 2)
    torch.testing.assert_close(embed(images), conv.flatten(2).transpose(1, 2), atol=1e-5, rtol=0)  # (2, 6, 8)
    overlapping = PatchEmbedding(channels=3, patch_size=4, d_model=8, stride=3)  # AST's: patches overlap
    conv = F.conv2d(images, overlapping.projection.weight.view(8, 3, 4, 4), overlapping.projection.bias, stride=3)
    torch.testing.assert_close(overlapping(images), conv.flatten(2).transpose(1, 2), atol=1e-5, rtol=0)  # (2, 6, 8)


def test_the_patch_positions_against_their_formulas():
    torch.manual_seed(0)
    k = torch.arange(6)  # a grid of 2 x 3 patches: k = 3 i + j
    learned = LearnedPatchPositional(4, (2, 3))
    torch.testing.assert_close(learned.encode(k), learned.table.weight)
    rows_cols = LearnedRowColumnPositional(4, (2, 3))
    expected = torch.stack([rows_cols.rows.weight[i] + rows_cols.columns.weight[j] for i in range(2) for j in range(3)])
    torch.testing.assert_close(rows_cols.encode(k), expected)
    # d_model 8: rows in channels 0-3, columns in 4-7, each sin/cos at frequencies 1 and 10000^(-2/4) = 1/100
    table = SinCos2DPositional(8, (2, 3)).encode(k)
    for patch, (i, j) in ((5, (1, 2)), (1, (0, 1)), (3, (1, 0))):
        by_hand = [
            math.sin(i),
            math.cos(i),
            math.sin(i / 100),
            math.cos(i / 100),
            math.sin(j),
            math.cos(j),
            math.sin(j / 100),
            math.cos(j / 100),
        ]
        assert table[patch].tolist() == pytest.approx(by_hand, abs=1e-6)


def test_the_class_token_goes_first_and_summarises_mean_pooling_averages_the_patches():
    x = torch.arange(12.0).view(1, 3, 4)  # (B, N, d_model)
    token = ClassToken(4)
    with torch.no_grad():
        token.token.fill_(-1.0)
    z = token(x)
    assert z.shape == (1, 4, 4) and z[0, 0].tolist() == [-1.0] * 4 and torch.equal(z[:, 1:], x)
    every = torch.ones(1, 4, dtype=torch.bool)
    assert token.pooling()(z, every).tolist() == [[-1.0] * 4]
    assert torch.equal(PatchMean(4)(x), x) and PatchMean.pooling()(x, every[:, :3]).tolist() == [[4, 5, 6, 7]]
    weights = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    assert ClassToken.attention_over_patches(weights).tolist() == pytest.approx([0.2, 0.7])
    assert PatchMean.attention_over_patches(weights).tolist() == pytest.approx([0.2, 0.7 / 3, 1.7 / 3])


def test_the_encoder_reads_the_class_token_then_the_embedded_patches_plus_positions():
    torch.manual_seed(0)
    model = build_model(*sized(**{**VIT, "patches": dict(size=2, positional="learned_2d")})).eval()
    images = torch.randn(2, 1, 8, 8)
    seen = []
    model.encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model.classify(images)
    x_p = patches(images, 2, 2)  # (2, 16, 4)
    k = torch.arange(16)
    z0 = (
        x_p @ model.patch_embed.projection.weight.T
        + model.patch_embed.projection.bias
        + model.positional.rows.weight[k // 4]
        + model.positional.columns.weight[k % 4]
    )
    expected = torch.cat([model.summary.token.expand(2, 1, 16), z0], dim=1)  # (2, 17, 16)
    torch.testing.assert_close(seen[0], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(image_width=10), r"image_width \(10\) must be divisible by patches.size \(4\)"),
        (
            dict(patches=dict(size=4, positional="rotary")),
            r"^patches.positional must be one of 'learned', 'learned_2d', 'sinusoidal_2d', 'none'",
        ),
        (
            dict(patches=dict(size=4, positional="sinusoidal_2d"), stack=dict(d_model=18, n_heads=3)),
            r"^patches.positional 'sinusoidal_2d' needs d_model divisible by 4 .*got 18",
        ),
        (
            dict(stack=dict(attention_backend="linear")),
            r"attention_backend 'linear' is blockwise or approximate, which an image's few patches do not need; use 'math' or 'sdpa' or 'auto'$",
        ),
        (dict(classifier=dict(pooling="max")), r"^classifier.pooling must be one of 'cls', 'distilled', 'mean'"),
    ],
)
def test_the_config_refuses_early_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        sized(**{**VIT, "patches": dict(size=4), **fields})


def test_attention_rollout_by_hand():
    # layer 1, two heads averaging to [[.5, .5], [.5, .5]]; + I, rows / 2 -> [[.75, .25], [.25, .75]]
    layer1 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]])[None]  # (1, 2, 2, 2)
    # layer 2, one head: [[.8, .2], [.4, .6]] -> [[.9, .1], [.2, .8]]
    layer2 = torch.tensor([[0.8, 0.2], [0.4, 0.6]])[None, None]
    # R = A2' A1' = [[.9 * .75 + .1 * .25, .9 * .25 + .1 * .75], [.2 * .75 + .8 * .25, .2 * .25 + .8 * .75]]
    assert attention_rollout([layer1, layer2])[0].tolist() == [pytest.approx([0.7, 0.3]), pytest.approx([0.35, 0.65])]
    assert attention_rollout([layer1])[0].tolist() == [pytest.approx([0.75, 0.25]), pytest.approx([0.25, 0.75])]


def test_the_digits_split_is_stratified_and_fixed():
    splits = digits(seed=0)
    assert {name: len(labels) for name, (_, labels) in splits.items()} == {"train": 1257, "valid": 180, "test": 360}
    counts = {name: [labels.count(str(c)) for c in range(10)] for name, (_, labels) in splits.items()}
    assert counts == {
        "train": [124, 128, 124, 128, 127, 127, 127, 125, 121, 126],  # of 178, 182, 177, 183, 181,
        "valid": [18] * 10,  # 182, 181, 179, 174, 180
        "test": [36, 36, 35, 37, 36, 37, 36, 36, 35, 36],
    }
    images = {name: pixels for name, (pixels, _) in splits.items()}
    assert images["train"].shape == (1257, 8, 8, 1) and images["test"].max() == 255.0
    rows = {tuple(row) for pixels in images.values() for row in pixels.reshape(len(pixels), -1).tolist()}
    assert len(rows) == 1797  # the 1,797 images are all different: none is lost or used twice


def write_png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def test_the_readmes_example_digits_are_two_test_digits_as_written_by_the_function(tmp_path):
    shipped = ROOT / "examples" / "digits"
    made = write_example_digits(tmp_path)
    assert [p.name for p in made] == ["seven.png", "three.png"]
    test_images, test_labels = digits(seed=0)["test"]
    for path, label in zip(made, ("7", "3")):
        pixels = np.asarray(Image.open(shipped / path.name))
        assert pixels.shape == (8, 8) and np.array_equal(pixels, np.asarray(Image.open(path)))
        i = next(i for i in range(len(test_labels)) if np.allclose(test_images[i, :, :, 0], pixels, atol=0.5))
        assert test_labels[i] == label
    tutorial = (ROOT / "docs" / "tutorials" / "images.md").read_text()
    assert "predict runs/digits-vit examples/digits/seven.png examples/digits/three.png" in tutorial


def test_the_folder_and_npz_readers(tmp_path):
    write_png(tmp_path / "cats" / "a.png", np.full((2, 3, 3), 10))
    write_png(tmp_path / "dogs" / "b.png", np.full((2, 3, 3), 200))
    (tmp_path / "dogs" / "notes.txt").write_text("not an image, not read")
    pixels, labels = read_folder(tmp_path, "rgb", None)
    assert pixels.shape == (2, 2, 3, 3) and labels == ["cats", "dogs"] and pixels[1, 0, 0].tolist() == [200] * 3
    pixels, _ = read_folder(tmp_path, "grey", 4)
    assert pixels.shape == (2, 4, 4, 1)
    np.savez(tmp_path / "d.npz", images=np.arange(24).reshape(3, 2, 4), labels=np.array([1, 0, 1]))
    pixels, labels = read_npz(tmp_path / "d.npz")
    assert pixels.shape == (3, 2, 4, 1) and labels == ["1", "0", "1"] and pixels[2, 1, 3, 0] == 23


def test_bad_images_are_refused_in_one_line(tmp_path):
    write_png(tmp_path / "a" / "1.png", np.zeros((4, 4)))
    write_png(tmp_path / "b" / "2.png", np.zeros((5, 4)))
    with pytest.raises(DataError) as mixed:
        read_folder(tmp_path, "grey", None)
    assert str(mixed.value) == (
        f"{tmp_path / 'b' / '2.png'}: 4x5 pixels, but {tmp_path / 'a' / '1.png'} is 4x4; set "
        f"data.images.resize to read images of mixed sizes"
    )
    assert read_folder(tmp_path, "grey", 4)[0].shape == (2, 4, 4, 1)
    (tmp_path / "b" / "3.png").write_bytes(b"\x89PNG but not really")
    with pytest.raises(DataError) as broken:
        read_folder(tmp_path, "grey", 4)
    assert str(broken.value) == f"{tmp_path / 'b' / '3.png'}: not an image that Pillow can decode"
    np.savez(tmp_path / "x.npz", pictures=np.zeros((2, 4, 4)))
    with pytest.raises(DataError, match=r"x.npz: no array 'images' or 'labels' \(it has pictures\)"):
        read_npz(tmp_path / "x.npz")
    with pytest.raises(ConfigError, match=r"resize is for image folders; x.npz holds images of one size"):
        task_config({"task": "image_classification", "train": "x.npz", "images": {"resize": 4}})


RECIPE = """\
model: {{arch: {arch}, {model}}}
data: {{task: image_classification, images: {{dataset: digits}}}}
train: {{max_steps: 60, batch_size: 64, optimizer: adamw, lr_schedule: constant, lr: 1.0e-2, warmup_steps: 1,
        eval_every: 60, log_every: 10, label_smoothing: 0.0, early_stop_metric: accuracy, progress: false}}
"""


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit")
    config = root / "vit.yaml"
    config.write_text(
        RECIPE.format(
            arch="vit",
            model="patches: {size: 2}, stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.0}",
        )
    )
    done = run_cli("train", str(config), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root, done


def test_a_vit_learns_the_digits_through_the_command_line(vit_run):
    root, done = vit_run
    assert (
        "images 8x8x1: train 1,257, valid 180, test 360; 10 classes 0, 1, 2, 3, 4, 5, 6, 7, 8, 9; augmentation none"
    ) in done.stdout
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert train[0] == pytest.approx(math.log(10), abs=0.2) and train[-1] < 0.85 * train[0]
    assert [r for r in records if r["split"] == "valid"][-1]["accuracy"] > 0.2  # chance: 0.1
    state = json.loads((root / "run" / "task_state.json").read_text())
    assert state["labels"] == [str(c) for c in range(10)] and state["shape"] == [8, 8, 1]
    info = run_cli("info", str(root / "run"))
    assert info.returncode == 0 and info.stdout.startswith(
        f"{root / 'run'}: vit, d_model 16, 2 heads, 1 layers, d_ff 32"
    )


def test_predict_and_evaluate_read_images_as_training_did(vit_run, tmp_path):
    root, _ = vit_run
    test_images, test_labels = digits(seed=0)["test"]
    paths = [write_png(tmp_path / f"{i}.png", test_images[i, :, :, 0]) for i in range(3)]
    done = run_cli("predict", str(root / "run"), *map(str, paths), "--json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    model, _, _ = load_run(root / "run")
    state = json.loads((root / "run" / "task_state.json").read_text())
    pixels = torch.tensor(test_images[:3].astype(np.uint8), dtype=torch.float32)  # as the PNG files hold them
    x = (pixels.permute(0, 3, 1, 2) - state["mean"][0]) / state["std"][0]
    with torch.no_grad():
        expected = model.classify(x).softmax(-1)
    for record, path, p in zip(records, paths, expected):
        assert record["input"] == str(path) and list(record["probabilities"].values()) == pytest.approx(
            p.tolist(), abs=1e-5
        )
    text = run_cli("predict", str(root / "run"), str(paths[0])).stdout
    assert text == f"{paths[0]}\t{records[0]['label']}\t{max(records[0]['probabilities'].values()):.4f}\n"
    split = json.loads(run_cli("evaluate", str(root / "run"), "--split", "test", "--json").stdout)
    assert split["examples"] == 360 and sum(map(sum, split["confusion"])) == 360
    np.savez(tmp_path / "test.npz", images=test_images[:, :, :, 0], labels=np.array(test_labels).astype(int))
    on_file = json.loads(run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "test.npz"), "--json").stdout)
    assert on_file["accuracy"] == split["accuracy"] and on_file["confusion"] == split["confusion"]
    refused = run_cli("predict", str(root / "run"), str(tmp_path / "missing.png"))
    assert refused.returncode == 4 and refused.stderr == f"error: {tmp_path / 'missing.png'}: no such file\n"
    # a larger drawing of the same digit is resized to the model's 8x8, with a note
    large = tmp_path / "large.png"
    Image.open(paths[0]).resize((64, 64), Image.Resampling.NEAREST).save(large)
    resized = run_cli("predict", str(root / "run"), str(large), "--json")
    assert (
        resized.returncode == 0
        and resized.stderr == f"note: {large}: 64x64 pixels, resized to the 8x8 the model reads\n"
    )
    assert json.loads(resized.stdout)["label"] == records[0]["label"]
    np.savez(tmp_path / "small.npz", images=test_images[:4, :4, :4, 0], labels=np.arange(4))
    small = run_cli("evaluate", str(root / "run"), "--data", str(tmp_path / "small.npz"))
    assert small.returncode == 4 and small.stderr == (
        f"error: {tmp_path / 'small.npz'}: images of 4x4 pixels and 1 "
        f"channel; the model reads 8x8 with 1 channel (set data.images.resize)\n"
    )
    refused = run_cli("predict", str(root / "run"))
    assert refused.returncode == 2 and "give the images to classify as arguments" in refused.stderr
    zero_shot = run_cli("predict", str(root / "run"), str(paths[0]), "--labels", "seven,three")
    assert zero_shot.returncode == 2 and zero_shot.stderr == (
        f"error: --labels is for runs of data.task 'contrastive'; {root / 'run'} is a run of data.task "
        f"'image_classification'\n"
    )


def test_inspect_draws_the_class_tokens_attention_over_the_patches_and_the_rollout(vit_run, tmp_path):
    root, _ = vit_run
    image = write_png(tmp_path / "seven.png", digits(seed=0)["test"][0][7, :, :, 0])
    done = run_cli("inspect", str(root / "run"), "--src", str(image), "--out", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "fig" / "summary.json").read_text())
    assert sorted(Path(f).name for f in summary["files"]) == ["encoder-0-patches.png", "entropy.png", "rollout.png"]
    maps = torch.tensor(summary["modules"]["encoder.layers.0.self_attn"]["patch_attention"])  # (H, 4, 4)
    assert maps.shape == (2, 4, 4) and bool((maps.sum((1, 2)) < 1).all())  # the rest is on the class token
    # one layer: the rollout is (mean over heads + I) / 2, of which the class token's row over the patches
    torch.testing.assert_close(torch.tensor(summary["rollout"]), maps.mean(0) / 2, atol=1e-5, rtol=0)
    assert f"prediction: {summary['prediction']['label']} (" in done.stdout


def test_the_cnn_baseline_trains_and_has_no_attention_to_inspect(tmp_path):
    config = tmp_path / "cnn.yaml"
    config.write_text(
        RECIPE.format(arch="cnn", model="d_model: 8")
        .replace("max_steps: 60", "max_steps: 20")
        .replace("eval_every: 60", "eval_every: 20")
    )
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "model: cnn, 2,002 parameters" in done.stdout  # 1*8*9+8 + 8*8*9+8 + 8*16*9+16 + 16*10+10
    image = write_png(tmp_path / "0.png", digits(seed=0)["test"][0][0, :, :, 0])
    refused = run_cli("inspect", str(tmp_path / "run"), "--src", str(image))
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} holds a model of arch 'cnn', which has no attention to inspect\n"
    )


@pytest.mark.parametrize("recipe,arch", [("vit.yaml", "vit"), ("cnn.yaml", "cnn")])
def test_the_digits_recipes_are_valid_configs(recipe, arch):
    from attnlab.runs.config import RunConfig

    cfg = RunConfig.from_file(Path(__file__).resolve().parents[1] / "recipes" / "digits" / recipe)
    assert cfg.model.arch == arch and cfg.data.images.dataset == "digits" and cfg.data.flip == "none"
