"""The scenes (data/scenes.py), a generated vision-and-language data set: the same data for a seed
(a hash pinned here), the grammar of captions and questions against hand-drawn scenes, the
compositional split, seeded noise, and the captions-file reader's one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attnlab import DataError
from attnlab.data import scenes
from attnlab.data.scenes import PALETTE, SceneObject, cell_centre, digest, generate, read_captions_file

# sha256 of the first 100 training scenes of seed 0 (pixels and captions), with Pillow 13.0.0
# (constraints.txt): a change here means the data set changed
FIRST_100 = "78e945ed3a6b1eaec62b6c2ae51b433956fea406b188c820cc18564db3615c4e"


def test_the_scenes_are_the_same_for_a_seed():
    first = generate("train", 100, seed=0)
    assert digest(first) == FIRST_100
    assert digest(generate("train", 100, seed=0)) == FIRST_100
    assert digest(generate("train", 100, seed=1)) != FIRST_100
    assert digest(generate("test", 100, seed=0)) != FIRST_100  # each split draws its own scenes
    assert all(s.pixels.shape == (32, 32, 3) and s.pixels.dtype == np.uint8 for s in first)


def test_a_scene_is_drawn_where_its_caption_and_questions_say():
    objects = (
        SceneObject("circle", "red", "small", 2, 0),
        SceneObject("square", "blue", "large", 0, 1),
        SceneObject("circle", "green", "small", 2, 1),
    )
    scene = scenes.Scene(objects, scenes.draw(objects, 32))
    assert scene.caption == "a small red circle left of a large blue square above a small green circle"
    assert scene.questions == [
        ("how many circles?", "2"),
        ("how many squares?", "1"),
        ("how many triangles?", "0"),
        ("what colour is the square?", "blue"),
        ("what shape is the red object?", "circle"),
        ("what shape is the blue object?", "square"),
        ("what shape is the green object?", "circle"),
    ]
    for o in objects:  # the centre of each object's cell has its colour; a corner of the image is background
        assert tuple(scene.pixels[cell_centre(o.row, 32), cell_centre(o.column, 32)]) == PALETTE[o.colour]
    assert scene.pixels[0, 0].tolist() == [0, 0, 0]
    big, small = (scenes.draw((SceneObject("square", "red", size, 1, 1),), 32) for size in ("large", "small"))
    assert (big[..., 0] > 0).sum() == 11 * 11 and (small[..., 0] > 0).sum() == 7 * 7  # radius 5 and 3, inclusive


def test_generated_captions_follow_the_objects_from_left_to_right():
    for scene in generate("train", 200, seed=3):
        order = [(o.column, o.row) for o in scene.objects]
        assert order == sorted(order) and len(set(order)) == len(order)  # one object per cell
        assert scene.caption.count(" a ") + 1 == len(scene.objects)


def test_the_compositional_split_never_shows_a_held_out_combination_in_training():
    held = ("red triangle", "blue circle")
    for split in ("train", "valid", "test"):
        drawn = generate(split, 1500, seed=0, held_out=held)
        assert not any(o.combination in held for s in drawn for o in s.objects)
        assert not any(name in s.caption for s in drawn for name in held)  # the text never names one either
        seen = {o.combination for s in drawn for o in s.objects}
        assert seen == {f"{c} {s}" for c in PALETTE for s in scenes.SHAPES} - set(held)  # every other one appears
    compositional = generate("compositional", 500, seed=0, held_out=held)
    assert all(any(o.combination in held for o in s.objects) for s in compositional)
    assert {o.combination for s in compositional for o in s.objects} >= set(held)


def test_noise_is_seeded_and_clipped():
    clean, noisy, again = (generate("train", 5, seed=0, noise=n) for n in (0.0, 20.0, 20.0))
    assert [s.caption for s in clean] == [s.caption for s in noisy]
    assert digest(noisy) == digest(again) != digest(clean)
    difference = noisy[0].pixels.astype(float) - clean[0].pixels
    assert 10 < difference[clean[0].pixels == 0].std() < 15  # N(0, 20^2) clipped at 0 on the black background
    assert noisy[0].pixels.dtype == np.uint8


def test_a_captions_file_is_read_and_its_bad_lines_refused_in_one_line(tmp_path):
    for i, scene in enumerate(generate("train", 2, seed=0)):
        Image.fromarray(scene.pixels).save(tmp_path / f"{i}.png")
    captions = tmp_path / "captions.tsv"
    captions.write_text("0.png\ta red circle\n1.png\t two squares \n")
    assert read_captions_file(captions) == [(tmp_path / "0.png", "a red circle"), (tmp_path / "1.png", "two squares")]
    bad = {
        "0.png a red circle\n": f"{captions}:1: expected 'image TAB caption', found no tab",
        "0.png\tok\nimg/9.png\ta blue square\n": f"{captions}:2: no image 'img/9.png' in {tmp_path}",
        "0.png\t \n": f"{captions}:1: expected 'image TAB caption', found an empty caption",
    }
    for text, message in bad.items():
        captions.write_text(text)
        with pytest.raises(DataError) as err:
            read_captions_file(captions)
        assert str(err.value) == message
