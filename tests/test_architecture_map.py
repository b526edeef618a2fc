"""docs/architecture.md's map of the package (its first code block, a tree of attnlab/) against the
files that exist: every module and static file is named under its folder, and every path the map
names is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "attnlab"
ENTRY_INDENT = 12  # deeper lines continue an entry's description
FILE = re.compile(r"[\w./]+\.(?:py|html|css|js)\b")


def tree(text: str) -> list[str]:
    """The lines of the map: the first code block after the heading 'Layers of the package'."""
    after = text[text.index("## Layers of the package") :]
    return after.split("```\n", 2)[1].splitlines()


def folders(lines: list[str]) -> dict[Path, str]:
    """Each folder of the map (relative to the repository) -> the text of its block: every line
    from its entry to the next entry as shallow as it."""
    blocks: dict[Path, str] = {}
    stack: list[tuple[int, Path]] = []  # (indent, folder) of the open folders
    for line in lines:
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if words and indent <= ENTRY_INDENT and words[0].endswith("/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            folder = (stack[-1][1] if stack else Path()) / words[0]
            stack.append((indent, folder))
            blocks[folder] = ""
        elif words and indent <= ENTRY_INDENT:
            while stack and stack[-1][0] >= indent:
                stack.pop()
        for _, open_folder in stack:
            blocks[open_folder] += line + "\n"
    return blocks


def named(blocks: dict[Path, str]) -> set[Path]:
    """Every file the map names: a bare name in its folder's own lines, a name with a folder
    (``nn/memory.py``) from the package's top."""
    names: set[Path] = set()
    for folder, text in blocks.items():
        own = text
        for child, child_text in blocks.items():
            if child.parent == folder:
                own = own.replace(child_text, "", 1)
        for word in FILE.findall(own):
            names.add(folder / word if "/" not in word else Path("attnlab") / word.removeprefix("attnlab/"))
    return names


def existing() -> set[Path]:
    """Every module of the package and every file of serve/static, relative to the repository."""
    files = [
        p
        for p in PACKAGE.rglob("*")
        if p.suffix in (".py", ".html", ".css", ".js") and "__pycache__" not in p.parts and p.name != "__init__.py"
    ]
    return {p.relative_to(ROOT) for p in files}


@pytest.fixture(scope="module")
def blocks() -> dict[Path, str]:
    return folders(tree(MAP.read_text(encoding="utf-8")))


def test_every_module_is_in_the_map(blocks):
    missing = sorted(str(p) for p in existing() - named(blocks))
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_file_the_map_names_exists(blocks):
    stale = sorted(str(p) for p in named(blocks) if not (ROOT / p).is_file())
    assert not stale, f"docs/architecture.md names files that do not exist: {', '.join(stale)}"


def test_every_folder_the_map_names_exists(blocks):
    stale = sorted(str(folder) for folder in blocks if not (ROOT / folder).is_dir())
    assert not stale, f"docs/architecture.md names folders that do not exist: {', '.join(stale)}"


def test_the_map_reader_finds_a_file_in_a_list_and_a_stale_name():
    """The reader itself: names in a list and in a folder's description count for that folder; a
    name under the wrong folder does not."""
    lines = [
        "attnlab/",
        "  nn/",
        "    a.py, b.py   two modules",
        "  cli/             one per group: c.py (c),",
        "                   d.py",
        "  e.py           beside nn/memory.py",
    ]
    found = named(folders(lines))
    assert found == {
        Path("attnlab/nn/a.py"),
        Path("attnlab/nn/b.py"),
        Path("attnlab/cli/c.py"),
        Path("attnlab/cli/d.py"),
        Path("attnlab/e.py"),
        Path("attnlab/nn/memory.py"),
    }
