"""Image captioning (arch captioner, data.task captioning): the config's early refusals, captions
files read as training data and an image that does not decode; cross-attention over the patches against torch.nn.MultiheadAttention, cached ==
uncached decoding, beam 1 == greedy; a tiny captioner trained, captioning and evaluated through the
command line, and its one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab import ConfigError, DataError, build_model, task_config
from attnlab.data.scenes import generate
from attnlab.decode.search import beam_search, greedy
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import Batching
from attnlab.tasks.captioning import Captioning

from helpers import assert_cached_matches_uncached, run_cli, sized

ROOT = Path(__file__).resolve().parents[1]


def test_a_bad_config_fails_early_naming_the_field():
    with pytest.raises(ConfigError, match=r"held_out: 'purple triangle' is not a 'COLOUR SHAPE' \(colours red, green"):
        task_config(
            {
                "task": "captioning",
                "images": {"dataset": "scenes"},
                "scenes": {"held_out": "red triangle, purple triangle"},
            }
        )
    with pytest.raises(ConfigError, match=r"held_out names no 'COLOUR SHAPE' combination; the compositional split"):
        task_config({"task": "captioning", "images": {"dataset": "scenes"}, "scenes": {"held_out": " , "}})
    with pytest.raises(ConfigError, match=r"dataset 'scenes' brings its own splits and images; drop train"):
        task_config({"task": "captioning", "images": {"dataset": "scenes"}, "train": "captions.tsv"})
    with pytest.raises(ConfigError, match=r"model.arch must be 'captioner' for data.task 'captioning'"):
        run_config({"arch": "vit", "patches": {"size": 4}})
    with pytest.raises(ConfigError, match=r"image_height \(30\) must be divisible by patches.size \(4\)"):
        sized(arch="captioner", vocab_size=10, image_height=30)
    with pytest.raises(
        ConfigError,
        match=r"attention_backend 'local' is blockwise or approximate, which an image's few patches do not need; use 'math' or 'sdpa' or 'auto'$",
    ):
        sized(arch="captioner", vocab_size=10, stack=dict(attention_backend="local"))


def run_config(model: dict):
    from attnlab.runs.config import RunConfig

    return RunConfig.from_sections(
        {"model": model, "data": {"task": "captioning", "images": {"dataset": "scenes"}}, "train": {}}
    )


def write_png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def test_captions_files_are_the_training_data_and_an_image_that_does_not_decode_is_one_line(tmp_path):
    for i, scene in enumerate(generate("train", 3, seed=0)):
        write_png(tmp_path / "img" / f"{i}.png", scene.pixels)
    captions = tmp_path / "captions.tsv"
    captions.write_text("img/0.png\ta red circle\nimg/1.png\ttwo squares\n")
    cfg = task_config({"task": "captioning", "train": str(captions), "valid": str(captions)})
    data = cfg.task.prepare(Batching(4096, 2, 0))
    assert data.splits["train"].images.shape == (2, 3, 32, 32) and data.splits["valid"].captions[1] == "two squares"
    torch.testing.assert_close(
        data.splits["train"].images[0], torch.tensor(generate("train", 1)[0].pixels).permute(2, 0, 1).float()
    )
    (tmp_path / "img" / "2.png").write_bytes(b"\x89PNG but not really")
    captions.write_text("img/0.png\ta red circle\nimg/2.png\ta broken image\n")
    with pytest.raises(DataError) as broken:
        cfg.task.prepare(Batching(4096, 2, 0))
    assert str(broken.value) == f"{tmp_path / 'img' / '2.png'}: not an image that Pillow can decode"


def test_a_split_whose_images_differ_in_size_from_the_training_images_is_named_by_its_file(tmp_path):
    for i, scene in enumerate(generate("train", 2, seed=0)):
        write_png(tmp_path / "img" / f"{i}.png", scene.pixels)
    write_png(tmp_path / "img" / "small.png", np.zeros((16, 16, 3)))
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train.write_text("img/0.png\ta red circle\nimg/1.png\ttwo squares\n")
    valid.write_text("img/small.png\ta small image\n")
    cfg = task_config({"task": "captioning", "train": str(train), "valid": str(valid)})
    with pytest.raises(DataError) as refused:
        cfg.task.prepare(Batching(4096, 2, 0))
    assert str(refused.value) == (
        f"{valid}: images of 16x16 pixels and 3 channels; the training images are 32x32 with 3 channels "
        f"(set data.images.resize)"
    )


# -- the model ---------------------------------------------------------------------------------------

CAPTIONER = dict(
    arch="captioner",
    vocab_size=19,
    image_height=16,
    image_width=12,
    channels=3,
    patches=dict(size=4),
    stack=dict(d_model=16, n_heads=2, d_ff=32, dropout=0.0),
    depths=dict(encoder=2, decoder=2),
)


def test_cross_attention_over_the_patches_is_multihead_attention_with_the_same_weights():
    torch.manual_seed(0)
    model = build_model(*sized(**CAPTIONER)).eval()
    images, tgt = torch.randn(2, 3, 16, 12), torch.randint(5, 19, (2, 6))
    memory, valid = model.encode(images)
    assert memory.shape == (2, 12, 16) and valid.all()  # a grid of 4 x 3 patches, each a key
    cross = model.decoder.layers[1].cross_attn
    seen = {}
    cross.register_forward_hook(lambda m, args, kwargs, out: seen.update(query=args[0], out=out), with_kwargs=True)
    model(images, tgt)
    reference = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([cross.q_proj.weight, cross.kv_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([cross.q_proj.bias, cross.kv_proj.bias]))
        reference.out_proj.weight.copy_(cross.out_proj.weight)
        reference.out_proj.bias.copy_(cross.out_proj.bias)
        expected, weights = reference(seen["query"], memory, memory)
    torch.testing.assert_close(seen["out"], expected, atol=1e-5, rtol=0)
    assert weights.shape == (2, 6, 12)  # each caption position over the 12 patches


def test_the_captioners_encoder_is_the_vits():
    torch.manual_seed(0)
    model = build_model(*sized(**CAPTIONER))
    images = torch.randn(1, 3, 16, 12)
    x = model.patch_embed(images) + model.positional.encode(torch.arange(12))  # x_p E + E_pos, no class token
    expected = model.encoder(x, torch.ones(1, 12, dtype=torch.bool), torch.arange(12))
    torch.testing.assert_close(model.encode(images)[0], expected)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi"])
def test_cached_decoding_equals_uncached(positional):
    torch.manual_seed(0)
    model = build_model(*sized(**CAPTIONER, positions=dict(scheme=positional))).eval()
    images, tgt = torch.randn(3, 3, 16, 12), torch.randint(5, 19, (3, 7))
    assert_cached_matches_uncached(model, tgt, src=images)
    assert_cached_matches_uncached(model, tgt, src=images, chunks=[3, 1, 3])
    assert greedy(model, images, 8, use_cache=True) == greedy(model, images, 8, use_cache=False)
    cached, uncached = (beam_search(model, images, 3, max_len=8, nbest=3, use_cache=c) for c in (True, False))
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    for kept, recomputed in zip(cached, uncached):
        assert [h.score for h in kept] == pytest.approx([h.score for h in recomputed], abs=1e-4)


def test_beam_1_is_greedy():
    torch.manual_seed(1)
    model = build_model(*sized(**CAPTIONER)).eval()
    images = torch.randn(4, 3, 16, 12)
    assert [hyps[0].tokens for hyps in beam_search(model, images, 1, max_len=9)] == greedy(model, images, 9)


# -- a tiny run through the command line -------------------------------------------------------------

RECIPE = """\
model: {arch: captioner, patches: {size: 8}, stack: {d_model: 32, n_heads: 2, d_ff: 64, dropout: 0.0}, depths: {encoder: 1, decoder: 1}}
data: {task: captioning, images: {dataset: scenes}, scenes: {max_objects: 1}, splits: {n_train: 600, n_valid: 50, n_test: 50}}
train: {max_steps: 150, batch_size: 32, optimizer: adamw, lr_schedule: constant, lr: 5.0e-3, warmup_steps: 1,
        eval_every: 150, eval_exact_match: 50, early_stop_metric: exact_match, label_smoothing: 0.0,
        progress: false}
"""


@pytest.fixture(scope="module")
def captioning_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("captioning")
    (root / "captioning.yaml").write_text(RECIPE)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: two, on two cores shared with other work, took 50x as long
    try:
        done = run_cli("train", str(root / "captioning.yaml"), "--out", str(root / "run"))
    finally:
        torch.set_num_threads(threads)
    assert done.returncode == 0, done.stderr
    return root, done


def test_a_tiny_captioner_learns_to_caption_one_object_scenes(captioning_run):
    root, done = captioning_run
    assert "captioned images 32x32x3: train 600, valid 50, test 50, compositional 50; vocabulary" in done.stdout
    valid = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ]
    assert valid[-1]["exact_match"] >= 0.5  # chance: 1 in 44 (2 sizes x 22 colour-shape pairs)
    result = run_cli("evaluate", str(root / "run"), "--split", "test", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["exact_match"] >= 0.5 and record["bleu"] > 50 and record["images"] == 50
    assert record["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    text = run_cli("evaluate", str(root / "run"), "--split", "compositional", "--beam", "1")
    assert text.returncode == 0 and "(50 images, split compositional, greedy)" in text.stdout


def test_evaluate_decodes_by_beam_and_lenpen_as_caption_does(captioning_run):
    """`evaluate --beam K --lenpen A` scores the captions of beam_search(K, A) run by hand on the
    split's standardised images; --beam 1 those of greedy search."""
    from attnlab.eval.metrics import exact_match
    from attnlab.runs.data import read_run_data
    from attnlab.runs.run_dir import RunDir

    root, _ = captioning_run
    model, tokenizers, _ = load_run(root / "run")
    data = read_run_data(RunDir(root / "run"), "test")
    images, references = data.standardise(data.splits["test"].images), data.splits["test"].captions
    by_hand = {
        ("1", "0.6"): [tokenizers["tgt"].decode(ids) for ids in greedy(model.eval(), images, data.max_caption_len)],
        ("3", "1.5"): [
            tokenizers["tgt"].decode(hyps[0].tokens)
            for hyps in beam_search(model, images, 3, 1.5, max_len=data.max_caption_len)
        ],
    }
    for (beam, lenpen), captions in by_hand.items():
        done = run_cli("evaluate", str(root / "run"), "--split", "test", "--beam", beam, "--lenpen", lenpen, "--json")
        assert done.returncode == 0, done.stderr
        record = json.loads(done.stdout)
        assert (record["beam"], record["lenpen"]) == (int(beam), float(lenpen) if beam != "1" else None)  # greedy: none
        assert record["exact_match"] == exact_match(captions, references)
        assert [e["caption"] for e in record["examples"]] == captions[:5]
    refused = run_cli("evaluate", str(root / "run"), "--split", "test", "--beam", "0")
    assert refused.returncode == 2 and refused.stderr.strip() == "error: --beam must be between 1 and 64 (got 0)"


def test_caption_decodes_image_files_greedy_and_by_beam(captioning_run, tmp_path):
    root, _ = captioning_run
    drawn = generate("test", 3, seed=0, max_objects=1)
    paths = [str(write_png(tmp_path / f"{i}.png", s.pixels)) for i, s in enumerate(drawn)]
    model, tokenizers, _ = load_run(root / "run")
    state = json.loads((root / "run" / "task_state.json").read_text())
    x = torch.stack([torch.tensor(s.pixels).permute(2, 0, 1).float() for s in drawn])
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    expected = [tokenizers["tgt"].decode(ids) for ids in greedy(model.eval(), x, 63)]
    for options in (["--beam", "1"], ["--beam", "1", "--no-cache"]):
        done = run_cli("caption", str(root / "run"), *paths, *options)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [f"{p}\t{c}" for p, c in zip(paths, expected)]
    beam = run_cli("caption", str(root / "run"), paths[0], "--beam", "3", "--nbest", "2")
    lines = beam.stdout.splitlines()
    # the 1-best's TAB-separated lines, with the score as a third field (not translate's Moses ' ||| ')
    assert beam.returncode == 0 and len(lines) == 2 and all(len(line.split("\t")) == 3 for line in lines)
    assert all(line.startswith(f"{paths[0]}\t") for line in lines)
    scores = [float(line.split("\t")[2]) for line in lines]
    assert scores == sorted(scores, reverse=True)


def test_caption_refuses_in_one_line(captioning_run, tmp_path):
    root, _ = captioning_run
    none = run_cli("caption", str(root / "run"))
    assert none.returncode == 2 and none.stderr.strip() == (
        "error: give the images to caption as arguments: attnlab caption RUN image.png [more.png ...]"
    )
    (tmp_path / "broken.png").write_bytes(b"not a png")
    broken = run_cli("caption", str(root / "run"), str(tmp_path / "broken.png"))
    assert broken.returncode == 4 and broken.stderr.strip() == (
        f"error: {tmp_path / 'broken.png'}: not an image that Pillow can decode"
    )
    inspected = run_cli(
        "inspect", str(root / "run"), "--src", str(tmp_path / "broken.png"), "--out", str(tmp_path / "f")
    )
    assert inspected.returncode == 4 and inspected.stderr.strip() == (
        f"error: {tmp_path / 'broken.png'}: not an image that Pillow can decode"
    )
    assert not (tmp_path / "f").exists()  # the figures' folder is made only once the input has been read
    words = run_cli("inspect", str(root / "run"), "--src", "a red square", "--out", str(tmp_path / "f"))
    assert words.returncode == 4 and words.stderr == (
        "error: --src a red square: no such file; a run of data.task "
        "'captioning' reads an image, so --src names an image file\n"
    )
    assert not (tmp_path / "f").exists()
    captions = tmp_path / "captions.tsv"
    for line, message in [
        ("broken.png a red circle", "1: expected 'image TAB caption', found no tab"),
        ("gone.png\ta red circle", f"1: no image 'gone.png' in {tmp_path}"),
    ]:
        captions.write_text(line + "\n")
        refused = run_cli("evaluate", str(root / "run"), "--data", str(captions))
        assert refused.returncode == 4 and refused.stderr.strip() == f"error: {captions}:{message}"
    translate = run_cli("translate", str(root / "run"), stdin="a red circle\n")
    assert translate.returncode == 2 and "`attnlab translate` needs data.task" in translate.stderr
    assert translate.stderr.count("\n") == 1


def test_inspect_draws_each_words_cross_attention_over_the_patch_grid(captioning_run, tmp_path, monkeypatch):
    """`inspect --src IMAGE` on a captioner: the maps it draws per word are the cross-attention
    weights of a hand-run teacher-forced forward over its caption (a 4x4 grid of 8x8 patches), per
    head and their mean, each summing to 1; and those of cached greedy decoding step by step."""
    from attnlab.analysis import inspect_images
    from attnlab.analysis.capture import capture_attention
    from attnlab.data.tokenizers import BOS
    from attnlab.views import inspect_run

    root, _ = captioning_run
    drawn = generate("test", 1, seed=3, max_objects=1)[0]
    path = write_png(tmp_path / "scene.png", drawn.pixels)
    plotted = []
    real_plot = inspect_images.patch_attention_plot
    monkeypatch.setattr(
        inspect_images,
        "patch_attention_plot",
        lambda picture, maps, *rest: plotted.append((picture, maps)) or real_plot(picture, maps, *rest),
    )
    done = inspect_run(root / "run", str(path), None, tmp_path / "figures", beam=1)
    model, tokenizers, cfg = load_run(root / "run")
    state = json.loads((root / "run" / "task_state.json").read_text())
    x = torch.tensor(drawn.pixels).permute(2, 0, 1).float()[None]
    x = (x - torch.tensor(state["mean"])[:, None, None]) / torch.tensor(state["std"])[:, None, None]
    ids = tokenizers["tgt"].encode(done["target"])
    assert ids == greedy(model.eval(), x, 63)[0] and done["target_tokens"][-1] == "<eos>"
    with capture_attention(model) as captured:
        model(x, torch.tensor([[BOS] + ids]))
    cross = [r.probs[0].reshape(2, len(ids) + 1, 4, 4) for r in captured.last().values() if r.kind == "cross"]
    assert len(cross) == 1 and cfg.patches.grid(RunDir(root / "run").read_shape()) == (4, 4)
    assert len(plotted) == 3  # head 0, head 1, the mean
    for maps, (picture, drawn_maps) in zip([cross[0][0], cross[0][1], cross[0].mean(0)], plotted):
        torch.testing.assert_close(drawn_maps, maps, atol=1e-6, rtol=0)
        torch.testing.assert_close(drawn_maps.sum((1, 2)), torch.ones(len(ids) + 1), atol=1e-5, rtol=0)
        assert picture.shape == (32, 32, 3) and np.allclose(picture, drawn.pixels / 255.0)
    summary = done["modules"]["decoder.layers.0.cross_attn"]["word_attention"]
    torch.testing.assert_close(torch.tensor(summary), cross[0], atol=1e-6, rtol=0)
    with capture_attention(model) as stepped:  # cached greedy decoding: (1, H, 1, N) per step
        greedy(model, x, 63, use_cache=True)
    steps = torch.cat([r.probs[0] for r in stepped.records if r.kind == "cross"], dim=1)  # (H, T, N)
    torch.testing.assert_close(steps, cross[0].flatten(2), atol=1e-5, rtol=0)
    files = sorted(Path(f).name for f in done["files"])
    assert files == [
        "decoder-0-cross-head0.png",
        "decoder-0-cross-head1.png",
        "decoder-0-cross-mean.png",
        "decoder-0-self.png",
        "encoder-0-self.png",
        "entropy.png",
    ]
    given = inspect_run(root / "run", str(path), "a large red circle", tmp_path / "given")
    assert given["target_tokens"] == ["a", "large", "red", "circle", "<eos>"] and given["target_given"]
    over_split = run_cli("inspect", str(root / "run"), "--split", "valid")  # mean entropies over the 50 images
    assert over_split.returncode == 0 and over_split.stdout.startswith("encoder.layers.0.self_attn")
    assert "decoder.layers.0.cross_attn" in over_split.stdout


def test_the_captioning_recipe_is_a_valid_config():
    from attnlab.runs.config import RunConfig

    cfg = RunConfig.from_file(ROOT / "recipes" / "multimodal" / "captioning.yaml")
    assert type(cfg.data.task) is Captioning and cfg.data.scenes.held_combinations == ("red triangle",)
    shape = cfg.planned_shape(vocab_size=17)
    assert (cfg.model.arch, shape.image_height, shape.channels, cfg.model.patches.grid(shape)) == (
        "captioner",
        32,
        3,
        (8, 8),
    )
    assert shape.vocab_size == 17
