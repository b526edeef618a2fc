"""`attnlab data get fsdd` on a miniature of the upstream repository made here (a few tiny WAVs
written with soundfile, and their sha256sum manifest), never the real recordings: the official split
by index, --from a clone, a flat folder or the training recordings alone, a download over loopback,
and a changed recording refused with nothing written."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import io
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from attnlab import DataError
from attnlab.cli import main
from attnlab.data import sources
from attnlab.data.fetch import NOTE, fetch
from attnlab.data.pinned import manifest_files
from attnlab.data.sources import DATASETS, FSDD_FILES, listing

# (digit, speaker, index): indices 0-4 are the official test split, 5-49 training
RECORDINGS = [(0, "george", 0), (0, "george", 7), (3, "theo", 4), (3, "theo", 5), (9, "lucas", 49), (7, "jackson", 12)]


def wav(digit: int, index: int) -> bytes:
    """A distinct 8 kHz 16-bit PCM WAV of 40 samples: a tone whose pitch and phase name the recording."""
    t = np.arange(40) / 8000
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * (300 + 100 * digit) * t + index), 8000, subtype="PCM_16", format="WAV")
    return buffer.getvalue()


REPOSITORY = {f"recordings/{d}_{s}_{i}.wav": wav(d, i) for d, s, i in RECORDINGS}
MANIFEST = "".join(f"{hashlib.sha256(data).hexdigest()}  {path}\n" for path, data in REPOSITORY.items())
MINI = dataclasses.replace(
    DATASETS["fsdd"],
    files=manifest_files(MANIFEST),
    test_sets={"test": tuple(f"test/{Path(p).name}" for p in REPOSITORY if int(Path(p).stem.split("_")[2]) < 5)},
)
TRAIN = {f"train/{Path(p).name}": data for p, data in REPOSITORY.items() if int(Path(p).stem.split("_")[2]) >= 5}
TEST = {f"test/{Path(p).name}": data for p, data in REPOSITORY.items() if int(Path(p).stem.split("_")[2]) < 5}


def written(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def put(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def mini(monkeypatch):
    monkeypatch.setattr(sources, "DATASETS", {"fsdd": MINI})


def test_the_shipped_manifest_is_the_pinned_tag_with_the_official_split():
    """3,000 recordings (6 speakers x 10 digits x 50), indices 0-4 the 300 test files, 5-49 training."""
    fsdd = DATASETS["fsdd"]
    assert fsdd.commit == "d6938f9bf1545aa66d8489fc9f1385a7abd64282" and fsdd.files == FSDD_FILES
    assert len(fsdd.files) == 3000 and len({f.sha256 for f in fsdd.files}) == 3000
    speakers = {Path(f.path).stem.split("_")[1] for f in fsdd.files}
    assert speakers == {"george", "jackson", "lucas", "nicolas", "theo", "yweweler"}
    for f in fsdd.files:
        digit, speaker, index = Path(f.path).stem.split("_")
        assert f.test == (int(index) < 5) and f.name == f"{'test' if f.test else 'train'}/{Path(f.path).name}"
        assert f.path == f"recordings/{Path(f.path).name}" and 0 <= int(digit) <= 9 and int(index) < 50
    assert sum(f.test for f in fsdd.files) == 300 and len(fsdd.test_sets["test"]) == 300
    assert listing([f.name for f in fsdd.files]) == "train/ (2,700 files), test/ (300 files)"
    with pytest.raises(ValueError, match="manifest line 2 "):
        manifest_files(MANIFEST.splitlines()[0] + "\n" + "0" * 64 + "  recordings/x.wav\n")


def test_a_clone_gives_the_official_train_and_test_split(mini, tmp_path, capsys):
    clone = put(tmp_path / "free-spoken-digit-dataset", REPOSITORY)
    out = tmp_path / "data" / "fsdd"
    assert main(["data", "get", "fsdd", "--from", str(clone), "--out", str(out)]) == 0
    files = written(out)
    note = files.pop(NOTE).decode()
    assert files == TRAIN | TEST and len(TRAIN) == 4 and len(TEST) == 2
    assert "Every file of the data set is here, test splits included." in note
    for path, data in REPOSITORY.items():  # the bytes written stand where the manifest has no size
        name = ("test/" if int(Path(path).stem.split("_")[2]) < 5 else "train/") + Path(path).name
        assert f"| {name} | `{path}` (bytes unchanged) | {len(data):,} | {hashlib.sha256(data).hexdigest()} |" in note
    assert capsys.readouterr().out.startswith(
        f"{out}: train/0_george_7.wav, train/3_theo_5.wav, train/7_jackson_12.wav, "
    )
    read, rate = sf.read(out / "train" / "3_theo_5.wav")
    assert (
        rate == 8000
        and read.shape == (40,)
        and np.isclose(read[1], 0.3 * np.sin(2 * np.pi * 600 / 8000 + 5), atol=1e-4)
    )


def test_the_training_recordings_alone_write_train_and_say_the_test_ones_are_missing(mini, tmp_path, capsys):
    """This project's copy holds recordings/ of indices 5-49 only: train is written, and one line
    says the test recordings are not there."""
    copy = put(tmp_path / "copy", {p: d for p, d in REPOSITORY.items() if int(Path(p).stem.split("_")[2]) >= 5})
    out = tmp_path / "out"
    assert main(["data", "get", "fsdd", "--from", str(copy), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    missing = [line for line in captured.err.splitlines() if "sha256 verified" not in line]
    assert missing == [
        f"not in {copy}, left out: test/0_george_0.wav, test/3_theo_4.wav (test splits; a download fetches them)"
    ]
    assert captured.out.endswith("; not written: test/0_george_0.wav, test/3_theo_4.wav\n")
    files = written(out)
    assert "Not here: test/0_george_0.wav, test/3_theo_4.wav (not in" in files.pop(NOTE).decode()
    assert files == TRAIN


def test_a_flat_folder_of_recordings_is_a_local_copy(tmp_path):
    flat = put(tmp_path / "flat", {Path(p).name: d for p, d in REPOSITORY.items()})
    fetch(MINI, tmp_path / "out", local=flat)
    assert {k: v for k, v in written(tmp_path / "out").items() if k != NOTE} == TRAIN | TEST


def test_a_changed_recording_is_refused_and_nothing_is_written(mini, tmp_path, capsys):
    changed = dict(REPOSITORY)
    changed["recordings/9_lucas_49.wav"] = changed["recordings/9_lucas_49.wav"][:-2] + b"\x00\x01"
    clone = put(tmp_path / "clone", changed)
    assert main(["data", "get", "fsdd", "--from", str(clone), "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.splitlines()[-1]
    assert (
        err.startswith(f"error: {clone / 'recordings/9_lucas_49.wav'}: sha256 ")
        and "of fsdd/train/9_lucas_49.wav" in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clone"]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


def test_a_download_from_upstream_layout_checks_every_file(tmp_path, monkeypatch):
    """The files come from BASE/OWNER/REPO/COMMIT/recordings/NAME (a mirror on 127.0.0.1 here)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    root = put(tmp_path / "mirror" / MINI.repo / MINI.commit, REPOSITORY).parents[2]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        log: list[str] = []
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        fetch(MINI, tmp_path / "out", base_url=base, timeout=5, log=log.append)
        assert {k: v for k, v in written(tmp_path / "out").items() if k != NOTE} == TRAIN | TEST
        assert f"downloading {base}/{MINI.repo}/{MINI.commit}/recordings/0_george_0.wav" in log
        (root / MINI.repo / MINI.commit / "recordings/0_george_0.wav").write_bytes(wav(0, 1))
        with pytest.raises(
            DataError, match=r"0_george_0\.wav: sha256 \w+ is not the pinned \w+ of fsdd/test/0_george_0\.wav"
        ):
            fetch(MINI, tmp_path / "again", base_url=base, timeout=5)
        assert not (tmp_path / "again").exists()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_the_test_set_names_the_first_missing_recording(mini, tmp_path):
    put(tmp_path / "data" / "fsdd", TRAIN)
    with pytest.raises(DataError) as err:
        sources.test_set_files("fsdd:test", tmp_path / "data")
    assert str(err.value).startswith(f"{tmp_path / 'data' / 'fsdd' / 'test' / '0_george_0.wav'}: no such file")
    put(tmp_path / "data" / "fsdd", TEST)
    assert sources.test_set_files("fsdd:test", tmp_path / "data") == [tmp_path / "data/fsdd" / n for n in TEST]
