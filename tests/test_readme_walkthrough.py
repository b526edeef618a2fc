"""The commands of README.md and of every tutorial (docs/tutorials/, in the order of its index), walked as
a user on a fresh clone types them (issues 64 and 65): offline, after `attnlab data get NAME --from
CLONE` of each data set's upstream repository layout, with long trainings shortened by --set.

What is walked: every command of every fenced ``bash`` block, in one temporary copy of the repository
shared by all the pages (its own data/ and runs/; .venv a link to this one), each block one `bash -e`
script, and every ``$ command`` of a ``text`` block, whose other lines are what the page says it
prints. The blocks that fetch data (`attnlab data ...`) run first, one after another in the pages'
order; the others, of every page together, run in two lanes side by side, one per core, each lane
in the pages' order, the blocks that name the same run or file in the same lane. The walk runs once
per session, and each page's test reports that page's failures. New commands are walked by default.
A block is left out, or some of its commands, only by an HTML comment on the lines just above its
fence, with the reason:

    <!-- walk: skip: REASON -->                  the whole block
    <!-- walk: skip `COMMAND PREFIX`: REASON --> the block's commands that start so

What the walk changes in a command, and nothing else:
- `attnlab train CONFIG ...` gets SHORT (2 steps) and, for a few commands, EXTRA's --set lines;
  `--resume` gets none: it continues the run with the run's own config;
- `attnlab data get NAME` without --from gets `--from CLONE`: nothing is downloaded;
- the words that the pages use for "your run" and "your files" (RUN, src.txt, ...) are runs that an
  earlier command wrote and small files that the walk writes (PLACEHOLDERS, USER_FILES).

The clones are miniature upstream layouts (data/task1/raw/train.de.gz, ETT-small/ETTh1.csv, ...)
with readable contents, so the runs train; the pinned sha256 of each file is the clone's (a
sitecustomize.py on the commands' PYTHONPATH pins them), since the real files cannot be fetched here.

Checked: each block's script exits 0; each `# -> PATH` comment's PATH, and each --out and --plot
of a walked command, exists afterwards; each text block's command exits 0 (non-zero where what
the page shows is an `error:` line) and prints the page's lines, in that order (lines the page leaves
out may come between). Timings are not asserted; the file is meant to stay within 3 minutes on 2 cores
(the commit that changes the walk says what it measured). A command moved from one page to another
is walked once, where it now is: the time follows the commands, not the pages."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.data.pinned import Dataset
from attnlab.data.sources import DATASETS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TUTORIALS = ROOT / "docs" / "tutorials"


def pages() -> list[Path]:
    """README.md, then each tutorial in the order of docs/tutorials/index.md's list."""
    listed = re.findall(r"^- \[[^]]+\]\((\w+)\.md\)", (TUTORIALS / "index.md").read_text(), flags=re.M)
    return [README, *(TUTORIALS / f"{name}.md" for name in listed)]


def where(page: Path) -> str:
    return str(page.relative_to(ROOT))


DIRECTIVE = re.compile(r"^<!-- walk: skip(?: `([^`]+)`)?: (\S.*?) -->$")
FENCE = re.compile(r"^```(\w*)$")

# 2 steps, evaluated once at the end; every train command of the walk gets these
SHORT = ("train.max_steps=2", "train.eval_every=2", "train.warmup_steps=1", "train.warmup_ratio=null")
EXTRA = {  # words of a train command -> further --set lines for it
    "--out runs/de-en": (
        "train.max_steps=5",
        "train.eval_every=1",
    ),  # 5 checkpoints: translation.md averages the last 5
    "configs/scan.yaml": ("train.eval_exact_match=8",),  # greedy decoding of 8 examples, not 200, per evaluation
    "recipes/multimodal/": (
        "data.splits.n_train=64",
        "data.splits.n_valid=16",
        "data.splits.n_test=16",
    ),  # scenes drawn: 96, not 4,700
    "recipes/audio/speech": (
        "data.splits.n_valid=32",
        "train.eval_exact_match=8",
    ),  # 32 validation strings, not 1,000, for the evaluations and the commands after them
    "recipes/export/whisper": ("data.splits.n_valid=32", "train.eval_exact_match=8"),  # as the speech recipes
}
PLACEHOLDERS = {  # the pages' word for a run or a file of the user's -> what the walk gives in its place
    "RUN": "runs/de-en",
}
WORDS = (
    "a man in a red shirt walks his little dog over the green grass while two women watch "
    "the children play near the old blue house"
).split()
GERMAN = (
    "ein mann in einem roten hemd geht mit seinem kleinen hund über das grüne gras während zwei "
    "frauen den kindern beim spielen am alten blauen haus zusehen"
).split()


def sentences(words: list[str], n: int, shift: int = 0) -> list[str]:
    return [" ".join(words[(i * 7 + shift + j) % len(words)] for j in range(4 + i % 6)) for i in range(n)]


USER_FILES = {  # the files the pages' commands read as the user's own
    "my/train.de": "\n".join(sentences(GERMAN, 60)) + "\n",
    "my/train.en": "\n".join(sentences(WORDS, 60)) + "\n",
    "my/val.de": "\n".join(sentences(GERMAN, 8, 3)) + "\n",
    "my/val.en": "\n".join(sentences(WORDS, 8, 3)) + "\n",
    "src.txt": "\n".join(sentences(GERMAN, 3, 5)) + "\n",
    "val.de": "\n".join(sentences(GERMAN, 4, 1)) + "\n",
    "val.en": "\n".join(sentences(WORDS, 4, 1)) + "\n",
    "train.tsv": "".join(f"{s}\t{'pos' if i % 2 else 'neg'}\n" for i, s in enumerate(sentences(WORDS, 60))),
    "dev.tsv": "".join(f"{s}\t{'pos' if i % 2 else 'neg'}\n" for i, s in enumerate(sentences(WORDS, 10, 2))),
    "test.tsv": "".join(f"{s}\t{'pos' if i % 2 else 'neg'}\n" for i, s in enumerate(sentences(WORDS, 10, 4))),
    "my_classifier.yaml": (
        "model: {arch: encoder_only, stack: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}}\n"
        "data: {task: classification, train: train.tsv, valid: dev.tsv, text: {tokenizer: word}}\n"
    ),
    "some_text.txt": "\n".join(sentences(WORDS, 20, 6)) + "\n",
    "captions.tsv": "scene.png\ta small red circle\n",
    "answers.csv": "id,label\n0,Mr. Hi\n33,Officer\n",
    "bad.yaml": "model:\n  arch: encoder_decoder\n  positions:\n    scheme: rotery\nshape:\n  vocab_size: 100\n",
}


# -- the pages' blocks -----------------------------------------------------------------------------


@dataclasses.dataclass
class Block:
    line: int  # the opening fence's line
    lang: str
    lines: list[tuple[int, str]]  # (line number, text) inside the fence
    skips: list[tuple[str | None, str]]  # (command prefix or None: all, reason)
    page: str = "README.md"  # where the block is, relative to the repository

    def commands(self) -> list[tuple[int, str]]:
        """(line, command) of a bash block: continuation lines joined, comment lines left out."""
        found: list[tuple[int, str]] = []
        pending: tuple[int, str] | None = None
        for number, text in self.lines:
            if pending is None and (not text.strip() or text.lstrip().startswith("#")):
                continue
            start, so_far = pending or (number, "")
            joined = so_far + (text.lstrip() if so_far else text)
            if joined.rstrip().endswith("\\"):
                pending = (start, joined.rstrip()[:-1].rstrip() + " ")
                continue
            pending = None
            found.append((start, joined.strip()))
        return found

    def skipped(self, command: str) -> str | None:
        """The reason a command is not walked, None where it is."""
        return next((reason for prefix, reason in self.skips if prefix is None or command.startswith(prefix)), None)


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """Every fenced block of a page, with the walk directives on the comment lines just above it."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        skips, j = [], i - 1
        while j >= 0 and lines[j].startswith("<!--"):
            directive = DIRECTIVE.match(lines[j])
            assert directive, f"{page}:{j + 1}: not a walk directive: {lines[j]!r}"
            skips.insert(0, (directive.group(1), directive.group(2)))
            j -= 1
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        blocks.append(Block(i + 1, fence.group(1), [(k + 1, lines[k]) for k in range(i + 1, end)], skips, page))
        i = end + 1
    return blocks


def without_comment(command: str) -> tuple[str, str]:
    """(the command, its trailing comment) split at the first ' # ' outside quotes."""
    quote = None
    for k, char in enumerate(command):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and command[k - 1 : k] == " " and command[k + 1 : k + 2] in (" ", ""):
            return command[:k].rstrip(), command[k + 1 :].strip()
    return command, ""


def walked_command(command: str, clones: Path) -> str:
    """The command as the walk runs it (the module docstring says what changes)."""
    command, _ = without_comment(command)
    words = command.split()
    command = with_placeholders_filled(command)
    if re.search(r"attnlab(?:\.cli)? train\b", command) and "--resume" not in words:
        extra = [s for words, sets in EXTRA.items() if words in command for s in sets]
        command += "".join(f" --set {s}" for s in (*SHORT, *extra))
    get = re.search(r"attnlab data get (\w+)", command)
    if get and "--from" not in words:
        command += f" --from {shlex.quote(str(clones / get.group(1)))}"
    return command


def with_placeholders_filled(text: str) -> str:
    for word, instead in PLACEHOLDERS.items():
        text = re.sub(rf"(?<![\w/.-]){re.escape(word)}(?![\w/.])", instead, text)
    return text


def outputs(command: str) -> list[str]:
    """The paths a walked command says it writes: its `# -> PATH`, --out and --plot."""
    command, comment = without_comment(command)
    paths = re.findall(r"--(?:out|plot) (\S+)", with_placeholders_filled(command))
    arrow = re.match(r"-> (\S+)", comment)
    return paths + ([arrow.group(1)] if arrow else [])


# -- the walk's world: clones, pins, a copy of the repository ---------------------------------------


def upstream_clone(dataset: Dataset) -> dict[str, bytes]:
    """A miniature clone of ``dataset``'s repository at its pinned commit: path -> bytes."""
    files: dict[str, bytes] = {}
    for n, f in enumerate(dataset.files):
        if dataset.name == "ett":
            header = "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT\n"
            rows = ett_rows(17_420, seed=len(f.path))
            text = header + "".join(rows)
        elif dataset.name == "fsdd":  # recordings: one short tone, the same bytes in every file
            files[f.path] = tone_wav()
            continue
        elif dataset.name == "scan":
            text = "".join(
                f"IN: {c} OUT: {a}\n"
                for c, a in (
                    ("jump twice", "I_JUMP I_JUMP"),
                    ("walk left", "I_TURN_LEFT I_WALK"),
                    ("run", "I_RUN"),
                    ("look twice", "I_LOOK I_LOOK"),
                )
                * 5
            )
        elif dataset.name == "sst2":
            text = "".join(
                f"{s}\t{i % 2}\n" for i, s in enumerate(sentences(WORDS, 80 if "train" in f.path else 12, n))
            )
        elif dataset.name == "multi30k":
            size = 120 if "train" in f.path else 12
            text = "\n".join(sentences(GERMAN if f.path.endswith(".de.gz") else WORDS, size, n // 2)) + "\n"
        else:  # tiny_shakespeare
            text = "".join(
                f"{speaker}:\n{line}\n\n"
                for speaker, line in zip(["ROMEO", "JULIET", "NURSE"] * 40, sentences(WORDS, 120))
            )
        data = text.encode()
        files.setdefault(f.path, gzip.compress(data, mtime=0) if f.gunzip else data)
    return files


def tone_wav() -> bytes:
    """50 ms of a 440 Hz tone, 8 kHz mono 16-bit PCM WAV (FSDD's format), written by soundfile."""
    import io

    import numpy as np
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, 0.5 * np.sin(2 * np.pi * 440 * np.arange(400) / 8000), 8000, subtype="PCM_16", format="WAV")
    return buffer.getvalue()


def ett_rows(n: int, seed: int) -> list[str]:
    """Hourly rows from 2016-07-01 00:00, seven smooth loads (deterministic)."""
    import math
    from datetime import datetime, timedelta

    start = datetime(2016, 7, 1)
    return [
        f"{start + timedelta(hours=h):%Y-%m-%d %H:%M:%S},"
        + ",".join(f"{10 + c + math.sin((h + seed) / (6 + c)) * 3:.3f}" for c in range(7))
        + "\n"
        for h in range(n)
    ]


def pins(dataset: Dataset, repository: dict[str, bytes]) -> list[tuple[int, str]]:
    """(size, sha256) of each of the data set's files as `data get --from` the clone writes them."""
    import hashlib

    return [
        (len(data), hashlib.sha256(data).hexdigest())
        for f in dataset.files
        for data in [repository[f.path] if f.stored else f.derive(repository[f.path], f.path)]
    ]


SITECUSTOMIZE = '''"""The walk's pins: each data set's files pinned to its miniature clone's (tests/test_readme_walkthrough.py)."""
import dataclasses, json, os

from attnlab.data import sources

for _name, _pins in json.loads(open(os.environ["ATTNLAB_WALK_PINS"]).read()).items():
    _dataset = sources.DATASETS[_name]
    sources.DATASETS[_name] = dataclasses.replace(_dataset, files=tuple(
        dataclasses.replace(f, size=size, sha256=sha) for f, (size, sha) in zip(_dataset.files, _pins)))
'''

USER_CLONES = {"ett": "ETDataset", "fsdd": "free-spoken-digit-dataset"}  # the clones the pages' --from names
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "runs",
    "data",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "*.egg-info",
    "hf",
    "build",
    "dist",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path | dict[str, str]]:
    """The repository's copy, the clones, and the environment the commands run in."""
    base = tmp_path_factory.mktemp("walk")
    copy, clones, site = base / "attnlab", base / "clones", base / "site"
    shutil.copytree(ROOT, copy, ignore=IGNORED)
    (copy / ".venv").symlink_to(Path(sys.prefix))
    table = {}
    for name, dataset in DATASETS.items():
        repository = upstream_clone(dataset)
        for path, data in repository.items():
            (clones / name / path).parent.mkdir(parents=True, exist_ok=True)
            (clones / name / path).write_bytes(data)
        table[name] = pins(dataset, repository)
    for name, folder in USER_CLONES.items():  # `data get ett --from ETDataset`: the user's clone
        shutil.copytree(clones / name, copy / folder)
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site / "pins.json").write_text(json.dumps(table))
    for name, text in USER_FILES.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(copy)]),
        "ATTNLAB_WALK_PINS": str(site / "pins.json"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MPLBACKEND": "Agg",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_COLOR": "1",
    }
    fetched_by_pages = {
        get.group(1)
        for block in all_blocks()
        if block.lang == "bash"
        for _, command in block.commands()
        if block.skipped(command) is None
        for get in [re.search(r"attnlab data get (\w+)", command)]
        if get
    }
    for name in sorted(set(DATASETS) - fetched_by_pages):  # the others, as their recipes' headers say
        done = subprocess.run(
            [str(Path(sys.executable).parent / "attnlab"), "data", "get", name, "--from", str(clones / name)],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    return {"copy": copy, "clones": clones, "env": env}


def run(script: str, world) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], cwd=world["copy"], env=world["env"], capture_output=True, text=True, timeout=300
    )


# -- the tests ----------------------------------------------------------------------------------------


def all_blocks() -> list[Block]:
    """Every fenced block of every walked page, in the pages' order."""
    return [block for page in pages() for block in readme_blocks(page.read_text(), where(page))]


def test_the_walk_reads_readme_and_every_tutorial():
    """A tutorial missing from docs/tutorials/index.md's list would not be walked (nor be in the site's
    navigation): every page of the folder is listed, each once."""
    walked = [where(page) for page in pages()]
    assert walked[0] == "README.md" and len(walked) == len(set(walked))
    assert sorted(walked[1:]) == sorted(where(p) for p in TUTORIALS.glob("*.md") if p.name != "index.md")


@pytest.mark.parametrize("page", pages(), ids=where)
def test_every_skip_names_a_reason_and_commands_of_its_block(page):
    """An exclusion that no longer matches a command (the page changed) fails here, so it cannot hide
    a new command."""
    for block in readme_blocks(page.read_text(), where(page)):
        at = f"{block.page}:{block.line}"
        assert block.lang in ("bash", "text") or not block.skips, f"{at}: walk directive on a {block.lang} block"
        commands = [c for _, c in block.commands()] if block.lang == "bash" else []
        for prefix, reason in block.skips:
            assert len(reason) > 10, f"{at}: say why {prefix or 'the block'} is not walked"
            assert prefix is None or any(c.startswith(prefix) for c in commands), (
                f"{at}: no command starts with {prefix!r}"
            )


def test_the_walk_covers_more_than_it_leaves_out():
    """Over README and the tutorials together (README's tour is a summary of the tutorials' commands,
    left out there, walked where the tutorials run them)."""
    commands = [(block, c) for block in all_blocks() if block.lang == "bash" for _, c in block.commands()]
    walked = sum(block.skipped(c) is None for block, c in commands)
    assert walked > len(commands) - walked


def test_a_new_command_is_walked_unless_a_directive_says_why_not():
    blocks = readme_blocks(
        "text\n<!-- walk: skip `make demo`: builds a venv -->\n```bash\nmake demo   # x\n"
        "attnlab train c.yaml \\\n    --out runs/x   # new\n```\n"
    )
    (block,) = blocks
    assert block.commands() == [(4, "make demo   # x"), (5, "attnlab train c.yaml --out runs/x   # new")]
    assert [block.skipped(c) for _, c in block.commands()] == ["builds a venv", None]
    assert walked_command("attnlab train configs/scan.yaml --out runs/x   # new", Path("/c")) == (
        "attnlab train configs/scan.yaml --out runs/x"
        + "".join(f" --set {s}" for s in SHORT)
        + " --set train.eval_exact_match=8"
    )
    assert walked_command("attnlab train c.yaml --out runs/x   # new", Path("/c")) == (
        "attnlab train c.yaml --out runs/x" + "".join(f" --set {s}" for s in SHORT)
    )
    assert walked_command("attnlab data get sst2  # -> data/sst2", Path("/c")) == "attnlab data get sst2 --from /c/sst2"
    assert walked_command('echo "a # b" | attnlab translate RUN --beam 5 # RUN: yours', Path("/c")) == (
        'echo "a # b" | attnlab translate runs/de-en --beam 5'
    )
    assert outputs("attnlab data get sst2  # -> data/sst2/train.tsv") == ["data/sst2/train.tsv"]
    assert outputs("attnlab prune RUN --fraction 0.4 --out RUN-pruned --plot p.png  # x") == [
        "runs/de-en-pruned",
        "p.png",
    ]
    with pytest.raises(AssertionError, match="not a walk directive"):
        readme_blocks("<!-- walk: skip -->\n```bash\nls\n```\n")


def walk_block(block: Block, world) -> list[str]:
    """What went wrong in one block ([] when it walked as its page says)."""
    at = block.page
    failures = []
    if block.lang == "bash":
        commands = [(n, c) for n, c in block.commands() if block.skipped(c) is None]
        script = "\n".join(
            [
                "set -eo pipefail",
                "trap 'echo \"walk: failed: $BASH_COMMAND\" >&2' ERR",
                *(walked_command(c, world["clones"]) for _, c in commands),
            ]
        )
        done = run(script, world)
        if done.returncode != 0:
            return [f"{at}:{block.line}: exit {done.returncode}\n{done.stderr[-2000:]}"]
        missing = [f"{n}: {p}" for n, c in commands for p in outputs(c) if not (world["copy"] / p).exists()]
        if missing:
            failures.append(f"{at}:{block.line}: not written: {missing}")
    for n, command, shown in transcript(block) if block.lang == "text" else []:
        done = run(walked_command(command, world["clones"]), world)
        printed = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
        fails = shown[:1] and shown[0].startswith("error:")
        if (done.returncode != 0) != bool(fails) or not in_order(shown, printed):
            failures.append(f"{at}:{n}: {command!r} exit {done.returncode}, printed:\n" + "\n".join(printed[-30:]))
    return failures


def walked_blocks() -> list[Block]:
    return [
        block
        for block in all_blocks()
        if (block.lang == "bash" and any(block.skipped(c) is None for _, c in block.commands()))
        or (block.lang == "text" and transcript(block))
    ]


def block_commands(block: Block) -> list[str]:
    """A walked block's commands (a text block's `$` lines)."""
    if block.lang == "bash":
        return [c for _, c in block.commands() if block.skipped(c) is None]
    return [c for _, c, _ in transcript(block)]


def fetches(block: Block) -> bool:
    """Whether the block fetches or writes data (`attnlab data ...`), which the others read."""
    return any(re.search(r"attnlab data \w", c) for c in block_commands(block))


def lanes(blocks: list[Block], n: int = 2) -> tuple[list[Block], list[list[Block]]]:
    """The blocks that fetch data (the others read it), then ``n`` lanes that may run side by side:
    blocks that name the same run or file (runs/NAME, RUN, scene.png, ...) stay in one lane, in the
    pages' order; lanes balanced by their number of commands."""
    first, rest = [b for b in blocks if fetches(b)], [b for b in blocks if not fetches(b)]
    names = [
        {
            name
            for command in block_commands(b)
            for name in re.findall(r"runs/[\w-]+|\b[\w-]+\.png\b", walked_command(command, Path("/")))
        }
        for b in rest
    ]
    group = list(range(len(rest)))  # union-find over blocks sharing a name

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i in range(len(rest)):
        for j in range(i):
            if names[i] & names[j]:
                group[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(rest)):
        groups.setdefault(root(i), []).append(i)
    size = lambda members: sum(len(block_commands(rest[i])) for i in members)  # noqa: E731
    split: list[list[int]] = [[] for _ in range(n)]
    for members in sorted(groups.values(), key=size, reverse=True):
        min(split, key=size).extend(members)
    return first, [[rest[i] for i in sorted(lane)] for lane in split]


@pytest.fixture(scope="module")
def walk(world) -> dict[str, list[str]]:
    """Every walked block of every page, once: the data first, then two lanes side by side (the 2
    cores; each process computes on one thread); page -> what went wrong there."""
    from concurrent.futures import ThreadPoolExecutor

    first, side_by_side = lanes(walked_blocks())
    failures: dict[str, list[str]] = {where(page): [] for page in pages()}
    for block in first:
        failures[block.page] += walk_block(block, world)

    def walk_lane(lane: list[Block]) -> list[tuple[str, list[str]]]:
        return [(block.page, walk_block(block, world)) for block in lane]

    with ThreadPoolExecutor(len(side_by_side)) as pool:
        for found in pool.map(walk_lane, side_by_side):
            for page, failed in found:
                failures[page] += failed
    return failures


@pytest.mark.parametrize("page", pages(), ids=where)
def test_readme_walkthrough(walk, page):
    """The page's commands walked as it says (all the pages are walked together, once: see ``walk``);
    all its failures reported together."""
    assert not walk[where(page)], "\n\n".join(walk[where(page)])


def test_the_lanes_keep_each_run_with_the_blocks_that_use_it():
    first, (a, b) = lanes(walked_blocks())
    fetched = " ".join(c for block in first for c in block_commands(block))
    assert "attnlab data get tiny_shakespeare" in fetched and "attnlab data get multi30k" in fetched
    assert not any(
        re.search(r"attnlab (train|translate|evaluate)", c) for block in first for c in block_commands(block)
    )

    def lane_of(text: str) -> int:
        (which,) = {k for k, lane in enumerate((a, b)) for block in lane for c in block_commands(block) if text in c}
        return which

    assert lane_of("--out runs/de-en") == lane_of("translate RUN") == lane_of("prune RUN --fraction 0.4 --out")
    assert (
        lane_of("--out runs/captioning")
        == lane_of("predict runs/dual_encoder scene.png")
        == lane_of("ask runs/visual_qa")
    )
    key = {(bl.page, bl.line): k for k, bl in enumerate(walked_blocks())}  # the pages' order
    assert sorted(key[bl.page, bl.line] for bl in [*first, *a, *b]) == list(range(len(key)))  # each once
    for lane in (first, a, b):
        assert [key[bl.page, bl.line] for bl in lane] == sorted(key[bl.page, bl.line] for bl in lane)


def transcript(block: Block) -> list[tuple[int, str, list[str]]]:
    """(line, command, the lines shown after it) of each `$ command` in a text block."""
    found: list[tuple[int, str, list[str]]] = []
    for number, text in block.lines:
        if text.startswith("$ "):
            found.append((number, text[2:], []))
        elif found:
            found[-1][2].append(text.rstrip())
    return found


def in_order(shown: list[str], printed: list[str]) -> bool:
    at = 0
    for line in shown:
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            return False
    return True
