"""`attnlab data get`: the pinned checksums, the download over HTTP (a server on 127.0.0.1, never the
internet), --from a local copy, and the refusals: each leaves nothing half written."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import http.server
import re
import threading
from pathlib import Path

import pytest

from attnlab import DataError
from attnlab.cli import main
from attnlab.data import sources
from attnlab.data.fetch import NOTE, fetch
from attnlab.data.pinned import Dataset, SourceFile
from attnlab.data.sources import DATASETS, ETT_ROWS

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PLAIN = b"jump twice\nwalk left\n"
TEXT = "Zwei Männer.\nEin Hund läuft.\n".encode()  # served gzipped
ROWS = b"date,x\n2016-07-01,1.5\n2016-07-02,2.5\n2016-07-03,3.5\n"  # the first 3 lines are kept
KEPT = b"date,x\n2016-07-01,1.5\n2016-07-02,2.5\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


TEST_TEXT = "Drei Katzen.\n".encode()  # a test file, served gzipped and pinned as stored
TEST_GZ = gzip.compress(TEST_TEXT, mtime=0)
# The final content of each development file: what `data get --dev-only` must write.
FINAL = {"plain.txt": PLAIN, "sub/text.de": TEXT, "rows.csv": KEPT}
# ... and of each test file: the whole csv (whose first lines are rows.csv) and the gunzipped test text.
TESTS = {"all_rows.csv": ROWS, "test.de": TEST_TEXT}
TINY = Dataset(
    name="tiny",
    repo="someone/tiny",
    commit=COMMIT,
    licence="MIT",
    citation="Someone (2024). Tiny.",
    files=(
        SourceFile("plain.txt", "plain.txt", len(PLAIN), sha(PLAIN)),
        SourceFile("raw/text.de.gz", "sub/text.de", len(TEXT), sha(TEXT), gunzip=True),
        SourceFile("csv/rows.csv", "rows.csv", len(KEPT), sha(KEPT), first_lines=3),
        SourceFile("csv/rows.csv", "all_rows.csv", len(ROWS), sha(ROWS), test=True),
        SourceFile("raw/test.de.gz", "test.de", len(TEST_GZ), sha(TEST_GZ), gunzip=True, test=True, stored=True),
    ),
)
# The repository's files at the commit, as the server holds them (gzip with mtime 0: the same bytes every run).
SERVED = {
    "plain.txt": PLAIN,
    "raw/text.de.gz": gzip.compress(TEXT, mtime=0),
    "csv/rows.csv": ROWS,
    "raw/test.de.gz": TEST_GZ,
}


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A folder laid out OWNER/REPO/COMMIT/PATH served on 127.0.0.1: (its base URL, the folder)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # a user's proxy must not see the loopback requests
    root = tmp_path / "mirror"
    for path, data in SERVED.items():
        target = root / TINY.repo / TINY.commit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def tiny_registered(monkeypatch):
    """The command line sees TINY as the only registered data set."""
    monkeypatch.setattr(sources, "DATASETS", {TINY.name: TINY})


def local_copy(folder: Path, files: dict[str, bytes] = FINAL) -> Path:
    """A --from folder: by default the development files alone, as this project's own copy is."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def written(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_download_over_loopback_writes_the_verified_files_and_a_note(server, tmp_path):
    """Every file, the test files too: gunzipped, cut to its first lines, or unchanged; a test file
    pinned by its stored .gz; the csv downloaded once for its two outputs."""
    base_url, _ = server
    log = []
    assert fetch(TINY, tmp_path / "out", base_url=base_url + "/", timeout=5, log=log.append) == list(TINY.files)
    files = written(tmp_path / "out")
    assert {k: v for k, v in files.items() if k != NOTE} == FINAL | TESTS
    note = files[NOTE].decode()
    assert f"from {base_url}/." in note and f"https://github.com/someone/tiny at commit `{COMMIT}`" in note
    assert "Licence: MIT" in note and "Every file of the data set is here, test splits included." in note
    for f in TINY.files:
        assert f"| {f.name} | `{f.path}` ({f.how}) | {f.size:,} | {f.sha256} |" in note
    assert "(gunzipped)" in note and "(first 3 lines)" in note and "(bytes unchanged)" in note
    assert "(gunzipped, size and sha256 of the stored file)" in note
    url = f"{base_url}/someone/tiny/{COMMIT}/"
    assert log == [
        f"downloading {url}plain.txt",
        f"plain.txt: {len(PLAIN):,} bytes, sha256 verified",
        f"downloading {url}raw/text.de.gz",
        f"sub/text.de: {len(TEXT):,} bytes, sha256 verified",
        f"downloading {url}csv/rows.csv",
        f"rows.csv: {len(KEPT):,} bytes, sha256 verified",
        f"all_rows.csv: {len(ROWS):,} bytes, sha256 verified",  # the same download
        f"downloading {url}raw/test.de.gz",
        f"test.de: {len(TEST_TEXT):,} bytes, sha256 verified",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror", "out"]  # no staging folder left beside it


def test_dev_only_leaves_the_test_files_out_and_says_so(server, tmp_path):
    base_url, _ = server
    assert fetch(TINY, tmp_path / "out", base_url=base_url, timeout=5, dev_only=True) == list(TINY.files[:3])
    files = written(tmp_path / "out")
    assert files.keys() == {*FINAL, NOTE}
    assert (
        "Not here: all_rows.csv, test.de (left out by --dev-only; `attnlab data get tiny --force` downloads them)."
    ) in files[NOTE].decode()


def test_a_changed_stored_test_file_is_refused(server, tmp_path):
    """A test file pinned by its .gz: a different .gz, even of the same text, is not the pinned file."""
    base_url, root = server
    (root / TINY.repo / COMMIT / "raw/test.de.gz").write_bytes(gzip.compress(TEST_TEXT, mtime=1))
    with pytest.raises(DataError, match=r"raw/test\.de\.gz: sha256 [0-9a-f]{64} is not the pinned .* of tiny/test\.de"):
        fetch(TINY, tmp_path / "out", base_url=base_url, timeout=5)
    assert not (tmp_path / "out").exists()


def test_a_local_copy_without_the_test_files_writes_the_rest_and_names_them(tiny_registered, tmp_path, capsys):
    copy = local_copy(tmp_path / "copy")
    out = tmp_path / "out"
    assert main(["data", "get", "tiny", "--from", str(copy), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        f"not in {copy}, left out: all_rows.csv, test.de.gz (test splits; a download fetches them)"
    )
    assert captured.out.endswith("; not written: all_rows.csv, test.de\n")
    assert written(out).keys() == {*FINAL, NOTE}
    assert f"Not here: all_rows.csv, test.de (not in {copy};" in written(out)[NOTE].decode()


def test_a_local_copy_with_the_test_files_gives_the_whole_data_set(tmp_path):
    """A --from folder holds the final files under their names, and a stored-pinned file as the .gz."""
    copy = local_copy(tmp_path / "copy", FINAL | {"all_rows.csv": ROWS, "test.de.gz": TEST_GZ})
    fetch(TINY, tmp_path / "out", local=copy)
    assert {k: v for k, v in written(tmp_path / "out").items() if k != NOTE} == FINAL | TESTS


def test_cli_downloads_from_base_url(server, tiny_registered, tmp_path, capsys):
    base_url, _ = server
    out = tmp_path / "data" / "tiny"
    assert main(["data", "get", "tiny", "--base-url", base_url, "--out", str(out)]) == 0
    assert written(out).keys() == {*FINAL, *TESTS, NOTE} and written(out)["sub/text.de"] == TEXT
    captured = capsys.readouterr()
    assert captured.out == (
        f"{out}: plain.txt, sub/text.de, rows.csv, all_rows.csv, test.de, sha256 verified (source "
        f"and licence: {out}/README.md)\n"
    )
    assert captured.err.count("sha256 verified") == 5


def test_cli_from_a_local_folder(tiny_registered, tmp_path, capsys, monkeypatch):
    copy = local_copy(tmp_path / "copy")
    monkeypatch.chdir(tmp_path)
    assert main(["data", "get", "tiny", "--from", str(copy)]) == 0  # default --out: data/NAME
    files = written(tmp_path / "data" / "tiny")
    assert {k: v for k, v in files.items() if k != NOTE} == FINAL
    assert f"from {copy}." in files[NOTE].decode()
    assert capsys.readouterr().out.startswith(
        f"{Path('data') / 'tiny'}: plain.txt, sub/text.de, rows.csv, sha256 verified"
    )


def test_a_changed_download_is_refused_naming_the_file_and_nothing_is_written(server, tmp_path):
    base_url, root = server
    (root / TINY.repo / COMMIT / "csv/rows.csv").write_bytes(ROWS.replace(b"2.5", b"2.6"))
    with pytest.raises(DataError) as err:
        fetch(TINY, tmp_path / "out", base_url=base_url, timeout=5)
    changed = sha(KEPT.replace(b"2.5", b"2.6"))
    assert str(err.value) == (
        f"{base_url}/someone/tiny/{COMMIT}/csv/rows.csv: sha256 {changed} is not the pinned "
        f"{sha(KEPT)} of tiny/rows.csv; nothing was written"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]  # no out, no staging folder


def test_a_changed_local_copy_is_refused_with_one_line_and_nothing_written(tiny_registered, tmp_path, capsys):
    copy = local_copy(tmp_path / "copy", {**FINAL, "plain.txt": PLAIN + b"run\n"})
    out = tmp_path / "out"
    assert main(["data", "get", "tiny", "--from", str(copy), "--out", str(out)]) == 4
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1].startswith(f"error: {copy / 'plain.txt'}: sha256 ")
        and "of tiny/plain.txt; nothing was written" in err[-1]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


def test_http_404_is_one_line_and_nothing_is_written(server, monkeypatch, tmp_path, capsys):
    base_url, _ = server
    elsewhere = dataclasses.replace(TINY, commit="f" * 40)  # a commit the server does not hold
    monkeypatch.setattr(sources, "DATASETS", {"tiny": elsewhere})
    assert main(["data", "get", "tiny", "--base-url", base_url, "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("downloading ")  # the progress line, then the error alone
    assert err[1:] == [f"error: cannot download {base_url}/someone/tiny/{'f' * 40}/plain.txt: HTTP 404 File not found"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]


def test_a_connection_refused_names_the_local_alternative(tmp_path):
    with pytest.raises(DataError, match=r"cannot download http://127\.0\.0\.1:1/.*--from DIR"):
        fetch(TINY, tmp_path / "out", base_url="http://127.0.0.1:1", timeout=5)
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_needs_force_which_replaces_only_the_same_names(tiny_registered, tmp_path, capsys):
    copy = local_copy(tmp_path / "copy")
    out = tmp_path / "out"
    local_copy(out, {"plain.txt": b"old\n", "mine.txt": b"keep me\n"})
    assert main(["data", "get", "tiny", "--from", str(copy), "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {out} already exists and is not empty; pass --force to replace its tiny files\n"
    )
    assert written(out) == {"mine.txt": b"keep me\n", "plain.txt": b"old\n"}
    assert main(["data", "get", "tiny", "--from", str(copy), "--out", str(out), "--force"]) == 0
    files = written(out)
    assert files.pop("mine.txt") == b"keep me\n" and files.pop(NOTE)
    assert files == FINAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "out"]


def test_an_empty_out_folder_is_filled_without_force(tmp_path):
    (tmp_path / "out").mkdir()
    fetch(TINY, tmp_path / "out", local=local_copy(tmp_path / "copy"))
    assert written(tmp_path / "out").keys() == {*FINAL, NOTE}


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["data", "get", "tin", "--from", "."],
            "error: unknown data set 'tin'; choose from tiny (did you mean 'tiny'?)",
        ),
        (["data", "get", "tiny", "--from", "missing"], "error: --from missing is not a folder"),
        (
            ["data", "get", "tiny", "--from", ".", "--base-url", "http://127.0.0.1:1"],
            "error: give --from or --base-url, not both",
        ),
        (
            ["data", "get", "tiny", "--base-url", "ftp://127.0.0.1"],
            "error: --base-url must start with http:// or https:// (got 'ftp://127.0.0.1')",
        ),
    ],
)
def test_usage_errors_are_one_line(args, message, tiny_registered, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    assert capsys.readouterr().err == message + "\n"
    assert list(tmp_path.iterdir()) == []


def test_a_local_copy_missing_a_file_names_what_it_needs(tiny_registered, tmp_path, capsys):
    copy = local_copy(tmp_path / "copy", {"plain.txt": PLAIN})
    assert main(["data", "get", "tiny", "--from", str(copy), "--out", str(tmp_path / "out")]) == 4
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {copy / 'sub/text.de'}: no such file (--from takes a folder holding plain.txt, sub/text.de, rows.csv, "
        f"all_rows.csv, test.de.gz, or a clone of https://github.com/someone/tiny)"
    )
    assert not (tmp_path / "out").exists()


def test_derive_gunzips_and_keeps_the_first_lines():
    gz, csv = TINY.files[1], TINY.files[2]
    assert gz.derive(gzip.compress(TEXT, mtime=0), "x") == TEXT
    with pytest.raises(DataError, match=r"^x: not a gzip file"):
        gz.derive(TEXT, "x")
    assert csv.derive(ROWS, "x") == KEPT
    assert csv.derive(KEPT, "x") == KEPT  # exactly 3 lines: unchanged
    assert csv.derive(b"a\nb", "x") == b"a\nb"  # fewer: unchanged


def test_data_list_names_every_registered_data_set(capsys):
    assert main(["data", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(DATASETS)
    for line, d in zip(lines, DATASETS.values()):
        assert (f"{d.size / 1e6:.1f} MB" if d.size is not None else "? MB") in line and d.licence in line
    assert main(["data", "get"]) == 0  # no name: the same list
    assert capsys.readouterr().out.splitlines() == lines


def test_every_registered_data_set_is_well_formed():
    assert set(DATASETS) == {"multi30k", "scan", "tiny_shakespeare", "sst2", "ett", "fsdd"}
    for key, d in DATASETS.items():
        assert d.name == key and re.fullmatch(r"[\w.-]+/[\w.-]+", d.repo), key
        assert re.fullmatch(r"[0-9a-f]{40}", d.commit), key
        assert d.licence and d.citation and "\n" not in d.licence
        names = [f.name for f in d.files]
        assert len(set(names)) == len(names) and NOTE not in names, key
        assert any(f.test for f in d.files) or key == "tiny_shakespeare", key  # the standard test sets too
        for f in d.files:
            assert re.fullmatch(r"[0-9a-f]{64}", f.sha256), (key, f.name)
            assert (f.size is None or f.size > 0) and (f.first_lines is None or f.first_lines > 0), (key, f.name)
            assert not Path(f.name).is_absolute() and ".." not in Path(f.name).parts, (key, f.name)
            assert not f.gunzip or f.path.endswith(".gz"), (key, f.name)
            assert not f.stored or f.test, (key, f.name)  # a development file's pin is of its final content


def test_evaluate_scores_a_standard_test_set_by_name(tmp_path, monkeypatch):
    """`evaluate RUN --test-set multi30k:test_2016_flickr` reads what `data get multi30k` writes under
    data/, the source and reference chosen by the run's languages: the same scores as naming the
    files; a test set that is not there, or not known, is one line."""
    import json

    from helpers import run_cli

    words = {"de": "null eins zwei drei".split(), "en": "zero one two three".split()}
    rows = [[(i * 7 + j) % 4 for j in range(1 + i % 3)] for i in range(40)]
    for lang, vocab in words.items():
        (tmp_path / f"train.{lang}").write_text("".join(" ".join(vocab[k] for k in r) + "\n" for r in rows))
    config = tmp_path / "tiny.yaml"
    config.write_text(f"""\
model: {{stack: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, dropout: 0.0}}}}
data: {{format: parallel, train: {tmp_path}/train, valid: {tmp_path}/train, pairs: {{src_lang: de, tgt_lang: en}},
       text: {{tokenizer: word}}}}
train: {{max_steps: 4, eval_every: 4, eval_exact_match: 0, early_stop_metric: valid_loss, progress: false}}
""")
    run = tmp_path / "run"
    assert run_cli("train", str(config), "--out", str(run)).returncode == 0
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "multi30k").mkdir(parents=True)
    for lang in ("de", "en"):  # reversed in the folder's order: the run's languages choose
        (tmp_path / "data" / "multi30k" / f"test_2016_flickr.{lang}").write_bytes(
            (tmp_path / f"train.{lang}").read_bytes()
        )
    by_name = run_cli("evaluate", str(run), "--test-set", "multi30k:test_2016_flickr", "--beam", "1", "--json")
    by_files = run_cli("evaluate", str(run), "--src", "train.de", "--ref", "train.en", "--beam", "1", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout) == json.loads(by_files.stdout)
    missing = run_cli("evaluate", str(run), "--test-set", "multi30k:test_2017_flickr")
    assert (missing.returncode, missing.stderr) == (
        4,
        f"error: {Path('data/multi30k/test_2017_flickr.de')}: no such "
        f"file; `attnlab data get multi30k` writes it (run from the "
        f"folder that holds data/)\n",
    )
    unknown = run_cli("evaluate", str(run), "--test-set", "multi30k:test2016")
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "error: --test-set multi30k:test2016: the test sets of multi30k are multi30k:test_2016_flickr, "
    )
    both = run_cli("evaluate", str(run), "--test-set", "multi30k:test_2016_flickr", "--split", "valid")
    assert both.returncode == 2 and "give --test-set alone" in both.stderr


def miniature(dataset: Dataset) -> tuple[Dataset, dict[str, bytes]]:
    """``dataset`` with its real repository paths and transforms, pinned to miniature contents, and
    the repository's files (path -> bytes) of a clone at its commit: a few lines per file, gzipped
    where the repository stores a .gz, each derived file cut to its first 3 lines. A data set of
    thousands of files (FSDD's recordings) keeps its first 5 development and 5 test files."""
    if len(dataset.files) > 40:
        dataset = dataclasses.replace(
            dataset,
            files=tuple([f for f in dataset.files if not f.test][:5] + [f for f in dataset.files if f.test][:5]),
        )
    repository = {}
    for f in dataset.files:
        text = "".join(f"{dataset.name} {Path(f.path).stem} line {i}\n" for i in range(5)).encode()
        repository.setdefault(f.path, gzip.compress(text, mtime=0) if f.gunzip else text)
    files = []
    for f in dataset.files:
        f = dataclasses.replace(f, first_lines=3 if f.first_lines else None)
        raw = repository[f.path]
        pinned = raw if f.stored else f.derive(raw, f.path)
        files.append(dataclasses.replace(f, size=len(pinned), sha256=sha(pinned)))
    return dataclasses.replace(dataset, files=tuple(files)), repository


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_a_clone_of_the_upstream_repository_is_a_local_copy(name, tmp_path, monkeypatch, capsys):
    """`data get NAME --from CLONE` on a clone laid out as the upstream repository (ETT-small/ETTh1.csv,
    data/task1/raw/train.de.gz, ...): the derived files (gunzipped, cut to the first lines) are made
    from the repository's files and verified, test files included."""
    dataset, repository = miniature(DATASETS[name])
    monkeypatch.setattr(sources, "DATASETS", {name: dataset})
    expected = {f.name: f.derive(repository[f.path], f.path) for f in dataset.files}
    clone = local_copy(tmp_path / dataset.repo.replace("/", "-"), repository)
    out = tmp_path / "data" / name
    assert main(["data", "get", name, "--from", str(clone), "--out", str(out)]) == 0, capsys.readouterr().err
    assert {k: v for k, v in written(out).items() if k != NOTE} == expected
    assert "Every file of the data set is here" in written(out)[NOTE].decode()


def test_ett_from_a_clone_makes_the_training_months_from_the_whole_file(tmp_path, monkeypatch):
    """The one data set whose development files exist only as derived: ETTh1_train_val.csv is the
    header and the first 11,520 hours of the clone's ETT-small/ETTh1.csv (a changed byte is refused)."""
    rows = b"date,HUFL\n" + b"".join(b"2016-07-01 00:00:00,%d\n" % i for i in range(ETT_ROWS + 5))
    kept = b"\n".join(rows.split(b"\n")[: 1 + ETT_ROWS]) + b"\n"
    files = tuple(
        dataclasses.replace(f, size=len(data), sha256=sha(data))
        for f in DATASETS["ett"].files
        for data in [rows if f.first_lines is None else kept]
    )
    ett = dataclasses.replace(DATASETS["ett"], files=files)
    clone = local_copy(tmp_path / "ETDataset", {"ETT-small/ETTh1.csv": rows, "ETT-small/ETTh2.csv": rows})
    fetch(ett, tmp_path / "out", local=clone)
    assert (tmp_path / "out" / "ETTh1_train_val.csv").read_bytes() == kept
    assert len(kept.splitlines()) == 1 + ETT_ROWS and (tmp_path / "out" / "ETTh2.csv").read_bytes() == rows
    local_copy(clone, {"ETT-small/ETTh2.csv": rows.replace(b",7\n", b",8\n")})
    with pytest.raises(DataError, match=r"ETT-small/ETTh2.csv: sha256 \w+ is not the pinned"):
        fetch(ett, tmp_path / "again", local=clone)
    assert not (tmp_path / "again").exists()


def test_a_missing_data_file_under_data_name_names_the_command_that_writes_it(tmp_path, monkeypatch):
    """A preset reads data/tiny_shakespeare/input.txt: when it is missing, the error says `attnlab data
    get tiny_shakespeare`; a file elsewhere (or of no registered data set) is just missing."""
    from attnlab.data.corpora import read_text
    from attnlab.data.images import read_image

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        read_text("data/tiny_shakespeare/input.txt")
    assert str(err.value) == (
        "data/tiny_shakespeare/input.txt: no such file; `attnlab data get tiny_shakespeare` "
        "writes it (run from the folder that holds data/)"
    )
    for path in ("data/mine/input.txt", "corpus/tiny_shakespeare/input.txt", "data/scan"):
        with pytest.raises(DataError) as err:
            read_text(path)
        assert str(err.value) == f"{path}: no such file"
    with pytest.raises(DataError, match=r"^data/multi30k/a.png: no such file; `attnlab data get multi30k`"):
        read_image("data/multi30k/a.png", "rgb", None)
