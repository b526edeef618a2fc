"""Bad input never crashes and never loses data: each case gives one 'error:' line, the documented
exit code and no traceback, and leaves every file that existed byte-identical. Untrusted
checkpoints are refused before anything in them runs; non-finite losses are skipped and counted."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
import subprocess
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.cli.main import make_parser
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, NumericalError, UsageError
from attnlab.eval import likelihood
from attnlab.runs.checkpoint import load_run
from attnlab.runs.config import RunConfig
from attnlab.runs.derived import write_average
from attnlab.runs.run_dir import RunDir
from attnlab.train.run import train_run

from helpers import ATTNLAB

# The exit codes of docs/reliability.md's table ("When something is wrong"), as attnlab/errors.py defines them.
USAGE, CONFIG, DATA, CHECKPOINT, NUMERICAL = (
    UsageError.exit_code,
    ConfigError.exit_code,
    DataError.exit_code,
    CheckpointError.exit_code,
    NumericalError.exit_code,
)

DIGITS_DE = "null eins zwei drei vier fünf sechs sieben acht neun".split()
DIGITS_EN = "zero one two three four five six seven eight nine".split()


def write_corpus(root: Path) -> None:
    rows = [[(i * 7 + j) % 10 for j in range(1 + i % 4)] for i in range(120)]
    for split, chunk in (("train", rows[:100]), ("val", rows[100:])):
        (root / f"{split}.de").write_text("".join(" ".join(DIGITS_DE[i] for i in r) + "\n" for r in chunk))
        (root / f"{split}.en").write_text("".join(" ".join(DIGITS_EN[i] for i in r) + "\n" for r in chunk))


CONFIG_TEXT = """\
model: {{stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.0}}, positions: {{scheme: learned, max_len: 32}}}}
data: {{format: parallel, train: {root}/train, valid: {root}/val, text: {{tokenizer: word}},
       pairs: {{src_lang: de, tgt_lang: en, max_src_len: 30, max_tgt_len: 30}}}}
train: {{max_steps: 4, max_tokens: 200, lr_schedule: constant, lr: 0.003, warmup_steps: 1, eval_every: 2,
        progress: false}}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A corpus, a config, a trained run, an output file: everything a user might have."""
    root = tmp_path_factory.mktemp("ws")
    write_corpus(root)
    (root / "good.yaml").write_text(CONFIG_TEXT.format(root=root))
    assert main(["train", str(root / "good.yaml"), "--out", str(root / "run")]) == 0
    (root / "out.txt").write_text("precious\n")
    (root / "input.de").write_text("eins zwei\ndrei\n")
    (root / "model.yaml").write_text(
        "model: {stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}\nshape: {vocab_size: 50}\n"
    )
    write_audio_runs(root)
    return root


def write_audio_runs(root: Path) -> None:
    """A digit classifier of tones (audio_cnn, 0.5 s clips) and a recogniser of strings of pips (whisper,
    2 s strings), one step each, and a good recording."""
    import numpy as np
    import soundfile as sf
    import test_audio_classification as classification
    import test_speech_recognition as speech

    tones = classification.write_tones(root / "tones", indices=range(5, 12))
    (root / "cnn.yaml").write_text(
        classification.RECIPE.format(
            arch="audio_cnn", model="features: {n_mels: 16}, width: 4", recordings=tones, steps=1
        )
    )
    assert main(["train", str(root / "cnn.yaml"), "--out", str(root / "audio_run")]) == 0
    (root / "speech.yaml").write_text(speech.RECIPE.format(recordings=speech.write_pips(root / "pips"), steps=1))
    assert main(["train", str(root / "speech.yaml"), "--out", str(root / "speech_run")]) == 0
    sf.write(root / "sound.wav", np.full(800, 0.1, np.float32), 8000)


def audio_file(name: str, samples: list[float] | None = None, rate: int = 8000):
    """A WAV of float ``samples`` (none: zero frames) written as bad.wav."""

    def setup(root: Path) -> None:
        import numpy as np
        import soundfile as sf

        sf.write(root / name, np.asarray(samples or [], np.float32), rate, subtype="FLOAT")

    return setup


def damaged_header(root: Path) -> None:
    (root / "bad.wav").write_bytes(b"RIFX" + (root / "sound.wav").read_bytes()[4:])  # big-endian: its fmt unreadable


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def empty_dir(root: Path) -> None:
    (root / "bad").mkdir()


def bad_file(name: str, data: bytes):
    def setup(root: Path) -> None:
        (root / name).write_bytes(data)

    return setup


def bad_config(text: str):
    return bad_file("bad.yaml", text.encode())


def config_with(**replace):
    def setup(root: Path) -> None:
        text = CONFIG_TEXT.format(root=root)
        for old, new in replace.items():
            text = text.replace(old.replace("__", "."), new)
        (root / "bad.yaml").write_text(text)

    return setup


def corrupt_corpus(split: str, lang: str, data: bytes):
    def setup(root: Path) -> None:
        (root / "bad").mkdir(exist_ok=True)
        for s in ("train", "val"):
            for lang_ in ("de", "en"):
                (root / "bad" / f"{s}.{lang_}").write_bytes((root / f"{s}.{lang_}").read_bytes())
        (root / "bad" / f"{split}.{lang}").write_bytes(data)
        (root / "bad.yaml").write_text(CONFIG_TEXT.format(root=root / "bad"))

    return setup


def damage_run(change):
    """Copy the trained run to bad_run/ and damage the copy."""

    def setup(root: Path) -> None:
        import shutil

        shutil.copytree(root / "run", root / "bad_run", dirs_exist_ok=True)
        change(RunDir(root / "bad_run"))

    return setup


def newest_weights(run: RunDir) -> Path:
    return run.step_dir(run.steps()[-1]) / "model.safetensors"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_config(run: RunDir, old: str, new: str) -> None:
    run.config.write_text(run.config.read_text().replace(old, new, 1))


def tsv_config(root: Path, text: str) -> None:
    (root / "bad.tsv").write_text(text)
    (root / "bad.yaml").write_text(
        f"model: {{stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}}}\n"
        f"data: {{format: tsv, train: {root}/bad.tsv, text: {{tokenizer: word}}}}\n"
    )


def scan_config(root: Path, text: str) -> None:
    (root / "bad.scan").write_text(text)
    (root / "bad.yaml").write_text(
        f"model: {{stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}}}\n"
        f"data: {{format: scan, train: {root}/bad.scan, text: {{tokenizer: word}}}}\n"
    )


nothing = None
TRAIN = ["train", "{root}/bad.yaml", "--out", "{root}/new_run"]
TRANSLATE = ["translate", "{root}/run", "--input", "{root}/input.de"]
BAD_RUN = ["translate", "{root}/bad_run", "--input", "{root}/input.de"]

CASES = [
    # -- configs ---------------------------------------------------------------------------------
    ("config missing", ["train", "{root}/none.yaml"], nothing, CONFIG, "no such config file"),
    ("yaml does not parse", TRAIN, bad_config("model: [1\n"), CONFIG, "YAML does not parse"),
    ("unknown section", TRAIN, bad_config("modle: {d_model: 8}\n"), CONFIG, "did you mean 'model'"),
    ("unknown field", TRAIN, config_with(**{"d_model: 16": "d_modle: 16"}), CONFIG, "did you mean 'd_model'"),
    ("mistyped value", TRAIN, config_with(**{"d_model: 16": "d_model: big"}), CONFIG, "d_model"),
    ("value out of range", TRAIN, config_with(**{"dropout: 0.0": "dropout: 1.5"}), CONFIG, "dropout must be in [0, 1)"),
    ("heads do not divide", TRAIN, config_with(**{"n_heads: 2": "n_heads: 3"}), CONFIG, "divisible by n_heads"),
    (
        "unknown choice",
        TRAIN,
        config_with(**{"scheme: learned": "scheme: rotery"}),
        CONFIG,
        "did you mean 'rotary'",
    ),
    ("negative steps", TRAIN, config_with(**{"max_steps: 4": "max_steps: -4"}), CONFIG, "max_steps"),
    ("config is a list", TRAIN, bad_config("- 1\n- 2\n"), CONFIG, "mapping"),
    # a --set is a line of config: whatever is wrong with it is a config error, as in the file
    ("--set without =", TRAIN + ["--set", "train.max_steps"], config_with(), CONFIG, "expected section.field=value"),
    ("--set unknown section", TRAIN + ["--set", "trian.lr=1"], config_with(), CONFIG, "did you mean 'train'"),
    ("--set value does not parse", TRAIN + ["--set", "train.lr=[1"], config_with(), CONFIG, "does not parse"),
    (
        "--set value only looks like a float",
        TRAIN + ["--set", "train.lr=--.inf"],
        config_with(),
        CONFIG,
        "lr must be a number (got '--.inf')",
    ),
    (
        "--set unknown field",
        TRAIN + ["--set", "train.max_step=3"],
        config_with(),
        CONFIG,
        "--set 'train.max_step=3': unknown field 'max_step' in section 'train' (did you mean 'max_steps'?)",
    ),
    (
        "--set value out of range",
        TRAIN + ["--set", "train.max_steps=-1"],
        config_with(),
        CONFIG,
        "bad.yaml --set train.max_steps=-1: max_steps must be >= 1 (got -1)",
    ),
    (
        "--set max_steps mistyped by an exponent",
        TRAIN + ["--set", "train.max_steps=100000000000000000000000"],
        config_with(),
        CONFIG,
        "max_steps must be at most 1,000,000,000 (got 100,000,000,000,000,000,000,000)",
    ),
    (
        "--set unknown field of a resumed run",
        ["train", "--out", "{root}/run", "--resume", "--set", "train.lr_schedul=noam"],
        nothing,
        CONFIG,
        "unknown field 'lr_schedul' in section 'train' (did you mean 'lr_schedule'?)",
    ),
    (
        "--set bad value of a resumed run",
        ["train", "--out", "{root}/run", "--resume", "--set", "train.lr=fast"],
        nothing,
        CONFIG,
        "lr must be a number (got 'fast')",
    ),
    (
        "info --set unknown field",
        ["info", "{root}/model.yaml", "--set", "model.n_layer=3"],
        nothing,
        CONFIG,
        "unknown field 'n_layer' in section 'model' (did you mean 'stack.n_layers'?)",
    ),
    (
        "info --set bad value",
        ["info", "{root}/model.yaml", "--set", "model.stack.n_layers=0"],
        nothing,
        CONFIG,
        "n_layers",
    ),
    # -- data --------------------------------------------------------------------------------------
    ("training file missing", TRAIN, config_with(**{"/train,": "/nowhere,"}), DATA, "no such file"),
    (
        "parallel line counts differ",
        TRAIN,
        corrupt_corpus("train", "en", b"one\ntwo\n"),
        DATA,
        "parallel files must align",
    ),
    ("empty training file", TRAIN, corrupt_corpus("train", "de", b""), DATA, "file is empty"),
    ("invalid UTF-8", TRAIN, corrupt_corpus("val", "de", b"eins\n\xff\xfe zwei\n"), DATA, "val.de:2: not valid UTF-8"),
    ("NUL bytes", TRAIN, corrupt_corpus("train", "de", b"eins\x00zwei\n" * 100), DATA, "NUL byte"),
    (
        "empty line in a corpus",
        TRAIN,
        corrupt_corpus("train", "en", b"one\n\n" + b"two\n" * 98),
        DATA,
        "train.en:2: empty line",
    ),
    (
        "a line far over the limit",
        TRAIN,
        corrupt_corpus("train", "de", b"eins " * 20000 + b"\n" + b"zwei\n" * 99),
        DATA,
        "train.de:1: a line of 100,000 characters",
    ),
    (
        "TSV row with one field",
        ["train", "{root}/bad.yaml", "--out", "{root}/new_run"],
        lambda root: tsv_config(root, "eins\tone\nzwei\n"),
        DATA,
        "bad.tsv:2: expected 2 tab-separated fields",
    ),
    (
        "TSV row with three fields",
        ["train", "{root}/bad.yaml", "--out", "{root}/new_run"],
        lambda root: tsv_config(root, "a\tb\tc\n"),
        DATA,
        "bad.tsv:1: expected 2 tab-separated fields (source, ",
    ),
    (
        "SCAN line without OUT:",
        ["train", "{root}/bad.yaml", "--out", "{root}/new_run"],
        lambda root: scan_config(root, "IN: jump OUT: I_JUMP\nIN: walk I_WALK\n"),
        DATA,
        "bad.scan:2: expected 'IN:",
    ),
    (
        "SCAN line without IN:",
        ["train", "{root}/bad.yaml", "--out", "{root}/new_run"],
        lambda root: scan_config(root, "jump OUT: I_JUMP\n"),
        DATA,
        "bad.scan:1: expected 'IN:",
    ),
    # -- run directories: nothing overwritten, nothing half-resumed -------------------------------
    ("--out exists", ["train", "{root}/good.yaml", "--out", "{root}/run"], nothing, USAGE, "already exists"),
    (
        "--resume of no run",
        ["train", "{root}/good.yaml", "--out", "{root}/nowhere", "--resume"],
        nothing,
        CHECKPOINT,
        "not a run directory",
    ),
    (
        "--resume with another model",
        ["train", "{root}/bad.yaml", "--out", "{root}/run", "--resume"],
        config_with(**{"d_ff: 32": "d_ff: 48"}),
        CONFIG,
        "a resumed run keeps its model, but the given config differs (model.stack.d_ff: 32 -> 48)",
    ),
    (
        "--resume with other data",
        ["train", "--out", "{root}/run", "--resume", "--set", "data.pairs.max_src_len=20"],
        nothing,
        CONFIG,
        "keeps its data, but the given config differs (data.pairs.max_src_len: 30 -> 20)",
    ),
    (
        "--resume with another train setting",
        [
            "train",
            "{root}/good.yaml",
            "--out",
            "{root}/run",
            "--resume",
            "--set",
            "train.lr=0.01",
            "--set",
            "train.progress=true",
        ],
        nothing,
        CONFIG,
        "resuming with train settings that differ from the run's: train.lr: 0.003 -> 0.01. Resume without a config",
    ),
    (
        "--resume without a config of no run",
        ["train", "--out", "{root}/nowhere", "--resume"],
        nothing,
        CHECKPOINT,
        "--resume: {root}/nowhere is not a run directory (no config.yaml)",
    ),
    ("train without a config", ["train"], nothing, USAGE, "train needs a CONFIG file (or --out RUN --resume"),
    (
        "average over an existing average",
        ["average", "{root}/run", "--last", "1"],
        lambda root: write_average(root / "run", 2, force=True),
        USAGE,
        "average already exists; pass --force",
    ),
    # -- checkpoints from elsewhere ---------------------------------------------------------------
    (
        "run directory missing",
        ["translate", "{root}/nowhere", "--input", "{root}/input.de"],
        nothing,
        CHECKPOINT,
        "not a run directory",
    ),
    # "not a run directory" is the same code in every command, for a folder that is not there or not a run
    *(
        (
            f"{argv[0]}{' CONFIG' if argv[1].endswith('.yaml') else ''} of {what} that is not a run",
            argv,
            setup,
            CHECKPOINT,
            "not a run directory",
        )
        for what, folder, setup in (
            ("a folder", "{root}/nowhere", nothing),
            ("an empty folder", "{root}/bad", empty_dir),
        )
        for argv in (
            ["train", "--out", folder, "--resume"],
            ["train", "{root}/good.yaml", "--out", folder, "--resume"],
            ["translate", folder, "--input", "{root}/input.de"],
            ["evaluate", folder, "--split", "valid"],
            ["generate", folder],
            ["score", folder, "--tgt", "{root}/input.de"],
            ["predict", folder],
            ["fill-mask", folder, "[MASK]"],
            ["forecast", folder, "--data", "{root}/series.csv"],
            ["inspect", folder, "--src", "eins"],
            ["prune", folder, "--fraction", "0.5"],
            ["average", folder],
            ["export", folder, "--weights", "bf16", "--out", "{root}/new_run"],
            ["serve", folder, "--port", "0"],
            ["caption", folder, "{root}/image.png"],
            ["transcribe", folder, "{root}/sound.wav"],
            ["ask", folder, "{root}/image.png", "--question", "what?"],
            ["export-hf", folder, "--out", "{root}/new_run"],
            ["export-ct2", folder, "--out", "{root}/new_run"],
            *([["info", folder]] if folder.endswith("bad") else []),
        )
    ),  # info reads a missing path as a file
    # -- audio (issue 62): each refused in one line naming the file, nothing written -------------------
    (
        "audio: not audio",
        ["predict", "{root}/audio_run", "{root}/bad.wav"],
        bad_file("bad.wav", b"not a sound\n"),
        DATA,
        "bad.wav: not an audio file that soundfile reads",
    ),
    (
        "audio: damaged header",
        ["predict", "{root}/audio_run", "{root}/bad.wav"],
        damaged_header,
        DATA,
        "damaged audio header",
    ),
    (
        "audio: empty file",
        ["transcribe", "{root}/speech_run", "{root}/bad.wav"],
        bad_file("bad.wav", b""),
        DATA,
        "bad.wav: empty file (0 bytes), not audio",
    ),
    (
        "audio: zero frames",
        ["predict", "{root}/audio_run", "{root}/bad.wav"],
        audio_file("bad.wav"),
        DATA,
        "bad.wav: no samples (a 8000 Hz file of 0 frames)",
    ),
    (
        "audio: NaN samples",
        ["transcribe", "{root}/speech_run", "{root}/bad.wav"],
        audio_file("bad.wav", [0.1] * 10 + [float("nan")] + [0.1] * 10),
        DATA,
        "bad.wav: NaN samples (1 frames, the first at frame 10",
    ),
    (
        "audio: longer than the model reads",
        ["transcribe", "{root}/speech_run", "{root}/bad.wav"],
        audio_file("bad.wav", [0.1] * 8000 * 3),
        DATA,
        "bad.wav: 3.00 s, longer than the 2 s the model reads (data.strings.longest_seconds)",
    ),
    (
        "audio: a folder with no audio",
        ["evaluate", "{root}/audio_run", "--data", "{root}/bad"],
        empty_dir,
        DATA,
        "bad: no audio files",
    ),
    (
        "audio: a run of another task",
        ["transcribe", "{root}/audio_run", "{root}/sound.wav"],
        nothing,
        USAGE,
        "is a run of data.task 'audio_classification'; `attnlab transcribe` needs data.task 'speech_recognition'",
    ),
    (
        "audio: a text run given a recording",
        ["predict", "{root}/run", "{root}/sound.wav"],
        nothing,
        USAGE,
        "is a run of data.task 'translation'",
    ),
    ("sweep spec missing", ["sweep", "{root}/none.yaml"], nothing, CONFIG, "none.yaml: no such sweep spec"),
    (
        "data get of an unknown data set",
        ["data", "get", "multi31k", "--out", "{root}/new_run"],
        nothing,
        USAGE,
        "unknown data set 'multi31k'; choose from multi30k, scan",
    ),
    (
        "import-hf of a folder that is not there",
        ["import-hf", "{root}/nowhere", "--out", "{root}/new_run"],
        nothing,
        CHECKPOINT,
        "no such folder",
    ),
    (
        "truncated weights",
        BAD_RUN,
        damage_run(lambda run: truncate(newest_weights(run))),
        CHECKPOINT,
        "differs from the recorded",
    ),
    (
        "a flipped byte in the weights",
        BAD_RUN,
        damage_run(lambda run: flip_byte(newest_weights(run))),
        CHECKPOINT,
        "differs from the recorded",
    ),
    (
        "weights of another shape",
        BAD_RUN,
        damage_run(lambda run: edit_config(run, "d_ff: 32", "d_ff: 48")),
        CHECKPOINT,
        "cannot load weights",
    ),
    (
        "config of another architecture",
        BAD_RUN,
        damage_run(lambda run: edit_config(run, "arch: encoder_decoder", "arch: decoder_lm")),
        CHECKPOINT,
        "model.arch 'decoder_lm' has no field 'depths'",
    ),
    (
        "damaged config in a run",
        BAD_RUN,
        damage_run(lambda run: run.config.write_text("model: [")),
        CONFIG,
        "YAML does not parse",
    ),
    (
        "damaged checksum record",
        BAD_RUN,
        damage_run(lambda run: (newest_weights(run).parent / "checksums.json").write_text("{")),
        CHECKPOINT,
        "checksums.json: damaged",
    ),
    # -- translate / evaluate / generate / score ----------------------------------------------------
    ("--output exists", TRANSLATE + ["--output", "{root}/out.txt"], nothing, USAGE, "pass --force"),
    ("--output is a directory", TRANSLATE + ["--output", "{root}/run"], nothing, USAGE, "is a directory"),
    ("input missing", ["translate", "{root}/run", "--input", "{root}/none.de"], nothing, DATA, "no such file"),
    (
        "input not UTF-8",
        ["translate", "{root}/run", "--input", "{root}/bad.de"],
        bad_file("bad.de", b"\xc3\x28\n"),
        DATA,
        "bad.de:1: not valid UTF-8",
    ),
    (
        "input is binary",
        ["translate", "{root}/run", "--input", "{root}/bad.de"],
        bad_file("bad.de", b"\x00\x01\x02"),
        DATA,
        "NUL byte",
    ),
    (
        "a source line over the model's length",
        ["translate", "{root}/run", "--input", "{root}/bad.de"],
        bad_file("bad.de", b"eins\n" + b"zwei " * 40 + b"\n"),
        DATA,
        "input line 2: 40 tokens",
    ),
    ("beam 0", TRANSLATE + ["--beam", "0"], nothing, USAGE, "--beam must be between 1 and 64"),
    ("absurd beam", TRANSLATE + ["--beam", "100000"], nothing, USAGE, "--beam must be between 1 and 64"),
    ("absurd batch", TRANSLATE + ["--batch-size", "10000000"], nothing, USAGE, "--batch-size must be between"),
    ("absurd length", TRANSLATE + ["--max-len", "1000000000"], nothing, USAGE, "beyond the model's max_len"),
    ("nbest over beam", TRANSLATE + ["--beam", "2", "--nbest", "3"], nothing, USAGE, "--nbest must be between"),
    ("beam not a number", TRANSLATE + ["--beam", "four"], nothing, USAGE, "invalid int value"),
    (
        "evaluate with line counts that differ",
        ["evaluate", "{root}/run", "--src", "{root}/input.de", "--ref", "{root}/one.en"],
        bad_file("one.en", b"one\n"),
        USAGE,
        "has 2 lines but",
    ),
    ("evaluate an unknown split", ["evaluate", "{root}/run", "--split", "dev"], nothing, USAGE, "no split 'dev'"),
    ("evaluate without references", ["evaluate", "{root}/run"], nothing, USAGE, "give --src and --ref"),
    (
        "generate from a translation model",
        ["generate", "{root}/run"],
        nothing,
        USAGE,
        "`attnlab generate` needs data.task 'language_model'",
    ),
    (
        "score a missing file",
        ["score", "{root}/run", "--src", "{root}/input.de", "--tgt", "{root}/none.en"],
        nothing,
        DATA,
        "no such file",
    ),
    (
        "evaluate a missing file",
        ["evaluate", "{root}/run", "--src", "{root}/none.de", "--ref", "{root}/input.de"],
        nothing,
        DATA,
        "none.de: no such file",
    ),
    ("average zero checkpoints", ["average", "{root}/run", "--last", "0"], nothing, USAGE, "--last must be at least 1"),
    ("prune everything", ["prune", "{root}/run", "--fraction", "1.5"], nothing, USAGE, "--fraction must be in [0, 1)"),
    (
        "prune --plot over an existing file",
        ["prune", "{root}/run", "--fraction", "0.5", "--plot", "{root}/out.txt"],
        nothing,
        USAGE,
        "out.txt already exists; pass --force to overwrite it",
    ),
    (
        "prune into an existing run",
        ["prune", "{root}/run", "--fraction", "0.5", "--out", "{root}/run"],
        nothing,
        USAGE,
        "already exists",
    ),
    ("inspect with empty text", ["inspect", "{root}/run", "--src", " "], nothing, USAGE, "empty after tokenisation"),
    (
        "info with a bad memory shape",
        ["info", "{root}/model.yaml", "--memory", "--seq-len", "0"],
        nothing,
        USAGE,
        "--seq-len",
    ),
    (
        "info with a zero source length",
        ["info", "{root}/model.yaml", "--flops", "--src-len", "0"],
        nothing,
        USAGE,
        "--src-len",
    ),
    ("bench with zero repeats", ["bench", "decode", "--repeats", "0"], nothing, USAGE, "--repeats"),
    ("unknown command", ["trian"], nothing, USAGE, "invalid choice: 'trian' (choose from"),
    ("mistyped command", ["captions"], nothing, USAGE, "'bench', 'data', 'demo') (did you mean 'caption'?)"),
    ("mistyped bench suite", ["bench", "decod"], nothing, USAGE, "(did you mean 'decode'?)"),
    (
        "absurd --max-new-tokens",
        ["generate", "{root}/run", "--max-new-tokens", "1000000"],
        nothing,
        USAGE,
        "--max-new-tokens must be between 0 and 100,000 (got 1,000,000)",
    ),
    (
        "absurd --num-samples",
        ["generate", "{root}/run", "--num-samples", "0"],
        nothing,
        USAGE,
        "--num-samples must be between 1 and 1024 (got 0)",
    ),
    # -- devices (this machine, and the suite everywhere, has no GPU: tests/conftest.py) ------------------
    *(
        (f"{argv[0]} on a GPU that is not there", argv, nothing, CONFIG, "--device is 'cuda' but no CUDA device")
        for argv in (
            TRANSLATE + ["--device", "cuda"],
            ["evaluate", "{root}/run", "--split", "valid", "--device", "cuda"],
            ["score", "{root}/run", "--tgt", "{root}/input.de", "--device", "cuda"],
            ["generate", "{root}/run", "--device", "cuda"],
            ["predict", "{root}/run", "--device", "cuda"],
            ["fill-mask", "{root}/run", "[MASK]", "--device", "cuda"],
            ["inspect", "{root}/run", "--src", "eins", "--device", "cuda"],
            ["prune", "{root}/run", "--fraction", "0.5", "--device", "cuda"],
            ["demo", "--device", "cuda"],
        )
    ),
    (
        "a GPU index that is not there",
        TRANSLATE + ["--device", "cuda:1"],
        nothing,
        CONFIG,
        "--device is 'cuda:1' but no CUDA device",
    ),
    (
        "a CUDA graph on the CPU",
        TRANSLATE + ["--kv-cache", "graph"],
        nothing,
        USAGE,
        "--kv-cache graph: kv_cache 'graph' records CUDA graphs, and this decode runs on 'cpu'",
    ),
    (
        "a cache that is no cache",
        ["evaluate", "{root}/run", "--split", "valid", "--kv-cache", "paged"],
        nothing,
        USAGE,
        "--kv-cache must be one of auto, dynamic, static, graph, compiled (got 'paged')",
    ),
    (
        "a device that is no device",
        TRANSLATE + ["--device", "gpu"],
        nothing,
        CONFIG,
        "--device must be auto, cpu, cuda or cuda:N (got 'gpu')",
    ),
    (
        "train.device that is no device",
        TRAIN,
        config_with(**{"progress: false": "progress: false, device: tpu"}),
        CONFIG,
        "device must be auto, cpu, cuda or cuda:N (got 'tpu')",
    ),
]


@pytest.mark.parametrize("name, argv, setup, code, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_an_exit_code_and_no_lost_file(workspace, capsys, name, argv, setup, code, message):
    for leftover in ("bad", "bad_run", "new_run"):
        import shutil

        shutil.rmtree(workspace / leftover, ignore_errors=True)
    if setup is not None:
        setup(workspace)
    before = snapshot(workspace)
    capsys.readouterr()
    returned = main([a.format(root=workspace) for a in argv])
    out, err = capsys.readouterr()
    assert returned == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message.format(root=workspace) in lines[0] and "Traceback" not in err
    after = snapshot(workspace)
    assert {k: after.get(k) for k in before} == before  # every file that was there is untouched


def test_the_corpus_reaches_every_command_and_gives_every_verdict():
    """Every command of `attnlab` refuses some bad input in the corpus above, and the corpus's verdicts
    are the exit codes of the errors bad input can cause (docs/reliability.md's table: usage, config, data,
    checkpoint), each of them given and no other (numerical errors and Ctrl-C are tested below and
    in test_cli.py)."""
    commands = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) - {argv[0] for _, argv, *_ in CASES} == set()
    assert len({name for name, *_ in CASES}) == len(CASES)  # one id each: pytest would run a repeated one once
    assert {code for *_, code, _ in CASES} == {USAGE, CONFIG, DATA, CHECKPOINT}


def test_the_docs_have_the_one_table_of_exit_codes_and_it_is_errors_py():
    """docs/reliability.md's "When something is wrong" table names each error class with its code, and
    every code of attnlab/errors.py is in it: the table the corpus above holds every command to."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    section = page.split("## When something is wrong", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| [^|]*\(`(\w+)`\) \|", section, flags=re.MULTILINE)
    classes = [AttnlabError, *AttnlabError.__subclasses__()]
    assert {name: int(code) for code, name in rows} == {cls.__name__: cls.exit_code for cls in classes}
    assert len({cls.exit_code for cls in classes}) == len(classes)  # one code per kind


@pytest.mark.parametrize(
    "argv, code", [(["translate", "{root}/run", "--beam", "0"], USAGE), (["train", "{root}/none.yaml"], CONFIG)]
)
def test_the_console_script_prints_no_traceback(workspace, argv, code):
    done = subprocess.run([*ATTNLAB, *[a.format(root=workspace) for a in argv]], capture_output=True, text=True)
    assert done.returncode == code and done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    debug = subprocess.run(
        [*ATTNLAB, "--debug", *[a.format(root=workspace) for a in argv]], capture_output=True, text=True
    )
    assert "Traceback" in debug.stderr


def test_unknown_words_are_read_as_unk_and_counted(workspace, capsys):
    (workspace / "unk.de").write_text("eins quatsch\nzwei\nfoo bar\n")
    assert main(["translate", str(workspace / "run"), "--input", str(workspace / "unk.de"), "--beam", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3
    assert "note: 3 unknown source tokens in 2 lines were read as <unk>" in err


def test_long_sources_are_cut_with_truncate(workspace, capsys):
    (workspace / "long.de").write_text("zwei " * 40 + "\n")
    assert main(["translate", str(workspace / "run"), "--input", str(workspace / "long.de"), "--truncate"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


class RunsCode:
    """A pickle payload that, if unpickled, creates a file (the side effect the test looks for)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_training_state_carrying_code_is_refused_and_the_code_never_runs(workspace, tmp_path):
    import shutil

    run = RunDir(tmp_path / "run")
    shutil.copytree(workspace / "run", run.path)
    marker = tmp_path / "pwned"
    state = run.step_dir(run.steps()[-1]) / "trainer_state.pt"
    with open(state, "wb") as f:
        pickle.dump({"optimizer": RunsCode(marker)}, f)
    config = workspace / "good.yaml"
    with pytest.raises(CheckpointError, match="differs from the recorded"):  # the checksum catches it first
        train_run(RunConfig.from_file(config, ["train.max_steps=6"]), run.path, resume=True, log=lambda s: None)
    sums = json.loads((state.parent / "checksums.json").read_text())
    sums["trainer_state.pt"] = hashlib.sha256(state.read_bytes()).hexdigest()  # a forger updates the record too
    (state.parent / "checksums.json").write_text(json.dumps(sums))
    with pytest.raises(CheckpointError, match="cannot load training state"):  # weights_only refuses it
        train_run(RunConfig.from_file(config, ["train.max_steps=6"]), run.path, resume=True, log=lambda s: None)
    assert not marker.exists()


def test_a_checkpoint_records_the_sha256_of_each_of_its_files(workspace):
    step_dir = RunDir(workspace / "run").step_dir(4)
    sums = json.loads((step_dir / "checksums.json").read_text())
    assert sums == {
        name: hashlib.sha256((step_dir / name).read_bytes()).hexdigest()
        for name in ("model.safetensors", "trainer_state.pt", "meta.json")
    }
    load_run(workspace / "run")  # and it passes its own check


def test_non_finite_losses_are_skipped_counted_and_stop_training(workspace, tmp_path, monkeypatch):
    real = likelihood.logits_of  # the forward of teacher_forced_loss, which the tasks train with
    calls = {"n": 0}

    def sometimes_nan(model, batch):  # the second and third training steps (validation never)
        calls["n"] += model.training
        logits = real(model, batch)
        return logits * float("nan") if model.training and calls["n"] in (2, 3) else logits

    monkeypatch.setattr(likelihood, "logits_of", sometimes_nan)
    cfg = RunConfig.from_file(workspace / "good.yaml", ["train.max_steps=5"])
    logged = []
    summary = train_run(cfg, tmp_path / "run", log=logged.append)
    assert summary["skipped_steps"] == 2 and summary["steps"] == 5  # every update tried is a step
    said = [
        re.match(
            r"step (\d+): (\d+) of the updates since step (\d+) had a non-finite loss or gradient and were "
            r"skipped \((\d+) in a row now, (\d+) in all\)",
            line,
        )
        for line in logged
    ]
    # seen where the host reads the device anyway: here the evaluations of steps 2 and 4 (log_every is 50)
    assert [tuple(map(int, m.groups())) for m in said if m] == [(2, 1, 0, 1, 1), (4, 1, 2, 0, 2)]
    weights = {k: v.clone() for k, v in load_run(tmp_path / "run")[0].state_dict().items()}
    assert all(torch.isfinite(v).all() for v in weights.values())

    monkeypatch.setattr(likelihood, "logits_of", lambda model, batch: real(model, batch) * float("inf"))
    cfg = RunConfig.from_file(
        workspace / "good.yaml", ["train.max_steps=5", "train.max_bad_steps=3", "train.precision=bf16"]
    )
    # seen at the evaluation of step 4: 4 in a row by then, over train.max_bad_steps (3)
    with pytest.raises(
        NumericalError,
        match="at step 4: the last 4 updates in a row had a non-finite loss .* the bf16 forward pass overflowed",
    ):
        train_run(cfg, tmp_path / "run2", log=lambda s: None)
