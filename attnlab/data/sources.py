"""The standard data sets behind `attnlab data get`: where each file comes from, and its checksum.

Each :class:`Dataset` names a public GitHub repository at a pinned commit and, for each of its
files, the path there, the name it is written under, and the sha256 of its final content (after
the transform, if any: gunzip, or "keep the first N lines"). :func:`fetch` downloads the files (or
takes them from a local copy, ``--from``), verifies every checksum before anything is written, and
publishes the folder at once, with a README.md saying where it came from: a failed or mismatched
download leaves nothing behind.

Only development splits are fetched (train, validation and the published splits that this
project develops on). The held-out test splits are not: this project keeps them out of its own
copy for independent checks, so their checksums cannot be pinned here.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import shutil
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attnlab.config import did_you_mean
from attnlab.errors import DataError, UsageError
from attnlab.files import atomic_write_bytes, atomic_write_text, is_leftover, publish_dir, staging_dir

GITHUB_RAW = "https://raw.githubusercontent.com"  # BASE/OWNER/REPO/COMMIT/PATH; --base-url replaces it
TIMEOUT = 60.0  # seconds without a byte before a download is given up
NOTE = "README.md"  # written beside the files: source, commit, licence, checksums
NOT_FETCHED_WHY = ("this project keeps its test splits out of its development copy for independent "
                   "checks, so their checksums cannot be pinned here")


@dataclass(frozen=True)
class SourceFile:
    """One file of a data set: its path in the repository, and what it must be once fetched."""

    path: str                       # in the repository, at the data set's commit
    name: str                       # in the output folder
    size: int                       # bytes of the final content
    sha256: str                     # of the final content
    gunzip: bool = False            # the repository holds it gzipped
    first_lines: int | None = None  # keep only the first N lines ('\n'-terminated) of the file

    def derive(self, raw: bytes, source: str) -> bytes:
        """The final content from the repository's bytes (``source`` names them in errors)."""
        if self.gunzip:
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as err:
                raise DataError(f"{source}: not a gzip file ({err})") from None
        if self.first_lines is not None:
            lines = raw.split(b"\n", self.first_lines)  # at most first_lines + 1 pieces: the rest is the last
            if len(lines) > self.first_lines:
                raw = b"\n".join(lines[:self.first_lines]) + b"\n"
        return raw

    @property
    def how(self) -> str:
        """How the file was derived from the repository's, in words."""
        steps = (["gunzipped"] if self.gunzip else []) + (
            [f"first {self.first_lines:,} lines"] if self.first_lines is not None else [])
        return ", ".join(steps) or "bytes unchanged"


@dataclass(frozen=True)
class Dataset:
    """A data set: a GitHub repository at a pinned commit, the files taken from it, and its terms."""

    name: str
    repo: str                       # OWNER/NAME on GitHub
    commit: str                     # 40 hex digits
    licence: str                    # one line
    citation: str
    held_out: str                   # what is not fetched (see NOT_FETCHED_WHY); '' when nothing is
    files: tuple[SourceFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def url(self, file: SourceFile, base_url: str = GITHUB_RAW) -> str:
        return f"{base_url.rstrip('/')}/{self.repo}/{self.commit}/{file.path}"


def _multi30k(split: str, lang: str, size: int, sha256: str) -> SourceFile:
    return SourceFile(f"data/task1/raw/{split}.{lang}.gz", f"{split}.{lang}", size, sha256, gunzip=True)


ETT_ROWS = 11_520  # the training (8,640) and validation (2,880) hours of the standard split

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset(
        name="multi30k", repo="multi30k/dataset", commit="a3d2e0d26b56f3846f66a952536ffed4e401d05a",
        licence="no licence file; the text is for non-commercial research and education (Flickr30K terms)",
        citation="Elliott, Frank, Sima'an & Specia (2016). Multi30K: Multilingual English-German Image "
                 "Descriptions. Proc. 5th Workshop on Vision and Language.",
        held_out="test_2016_flickr, test_2017 and test_2018",
        files=(
            _multi30k("train", "de", 2_110_398, "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
            _multi30k("train", "en", 1_801_238, "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
            _multi30k("val", "de", 75_981, "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
            _multi30k("val", "en", 63_297, "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
        )),
    Dataset(
        name="scan", repo="brendenlake/SCAN", commit="c4b756cbc010d75c912f16c42c8f15dc6b7e6c8f",
        licence="BSD 3-clause (Facebook, Inc.): keep the notice when redistributing",
        citation="Lake & Baroni (2018). Generalization without systematicity: On the compositional skills "
                 "of sequence-to-sequence recurrent networks. ICML 2018.",
        held_out="the length split's test file, the add-primitive and template splits, and tasks.txt "
                 "(which holds every test command)",
        files=tuple(SourceFile(path, path, size, sha256) for path, size, sha256 in (
            ("simple_split/tasks_train_simple.txt", 3_267_938,
             "941bb8a088c5f53ceff12fde902dc008933cf0c4203cc672c47b5f79d73262dd"),
            ("simple_split/tasks_test_simple.txt", 812_450,
             "1fe1c8f5a19d0dc40e41bab94278f45f66f3dc415a978bd29855a23440610fc6"),
            ("length_split/tasks_train_length.txt", 2_723_418,
             "b034212dc7cf87ce62f3a067dd6ad49c4d5cd18d51d615d13825516bcb1ebbc2"),
        ))),
    Dataset(
        name="tiny_shakespeare", repo="karpathy/char-rnn", commit="6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
        licence="MIT (char-rnn); the text itself is in the public domain",
        citation="Karpathy (2015). char-rnn. https://github.com/karpathy/char-rnn",
        held_out="",
        files=(SourceFile("data/tinyshakespeare/input.txt", "input.txt", 1_115_394,
                          "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),)),
    Dataset(
        name="sst2", repo="clairett/pytorch-sentiment-classification",
        commit="457ffd83de90a9d6d472d8ffc31bbffe40a8b236",
        licence="no licence file; the Stanford Sentiment Treebank is published for research use",
        citation="Socher et al. (2013). Recursive Deep Models for Semantic Compositionality Over a Sentiment "
                 "Treebank. EMNLP 2013.",
        held_out="test.tsv (1,821 sentences)",
        files=(
            SourceFile("data/SST2/train.tsv", "train.tsv", 720_259,
                       "ec192f833a64da08f475488a77b0d0b47db47acd0f458bd18433fc793b569920"),
            SourceFile("data/SST2/dev.tsv", "dev.tsv", 92_057,
                       "eddea6b39e601dd4e7a672b53cc40fdf6019fa80522f351206c24340ca5d9359"),
        )),
    Dataset(
        name="ett", repo="zhouhaoyi/ETDataset", commit="1d16c8f4f943005d613b5bc962e9eeb06058cf07",
        licence="CC BY-ND 4.0: share with attribution, do not distribute modified versions",
        citation="Zhou et al. (2021). Informer: Beyond Efficient Transformer for Long Sequence Time-Series "
                 "Forecasting. AAAI 2021.",
        held_out=f"every row after the first {ETT_ROWS:,} of each file (the test months and the unused tail)",
        files=tuple(SourceFile(f"ETT-small/{series}.csv", f"{series}_train_val.csv", size, sha256,
                               first_lines=1 + ETT_ROWS)  # the header, then the rows
                    for series, size, sha256 in (
            ("ETTh1", 1_711_301, "0ac0ce309049e14728c529a0fa98e682edecf8650331c5b977e5a8dc3636b3b0"),
            ("ETTh2", 1_599_807, "b3609c990d57344f0e186ea337c077453dc1b83fdb6b36952537b5a8bf5fed0a"),
        ))),
)}


def lookup(name: str) -> Dataset:
    """The registered data set of that name; an unknown one is refused, listing the valid names."""
    if name not in DATASETS:
        raise UsageError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}{did_you_mean(name, DATASETS)}")
    return DATASETS[name]


def fetch(dataset: Dataset, out: str | Path, *, base_url: str = GITHUB_RAW, local: str | Path | None = None,
          force: bool = False, timeout: float = TIMEOUT, log: Callable[[str], None] = lambda line: None) -> None:
    """Write ``dataset``'s files and its README.md note into the folder ``out``.

    The files are downloaded from ``base_url`` (laid out as BASE/OWNER/REPO/COMMIT/PATH), or read
    from the folder ``local``, which holds the final files under their output names. Every sha256
    is verified in a staging folder before ``out`` is published. An existing, non-empty ``out`` is
    refused unless ``force``; then only the files of the same names are replaced in it.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(not is_leftover(p) for p in out.iterdir()) and not force:
        raise UsageError(f"{out} already exists and is not empty; pass --force to replace its {dataset.name} files")
    if local is not None:
        local = Path(local)
        if not local.is_dir():
            raise UsageError(f"--from {local} is not a folder")
        origin = str(local)
    else:
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"--base-url must start with http:// or https:// (got {base_url!r})")
        origin = base_url
    staged = staging_dir(out)
    try:
        for file in dataset.files:
            if local is not None:
                source = str(local / file.name)
                data = _read(local / file.name, dataset)
            else:
                source = dataset.url(file, base_url)
                log(f"downloading {source}")
                data = file.derive(_download(source, timeout), source)
            digest = hashlib.sha256(data).hexdigest()
            if digest != file.sha256:
                raise DataError(f"{source}: sha256 {digest} is not the pinned {file.sha256} of "
                                f"{dataset.name}/{file.name}; nothing was written")
            atomic_write_bytes(staged / file.name, data)
            log(f"{file.name}: {len(data):,} bytes, sha256 verified")
        atomic_write_text(staged / NOTE, note(dataset, origin))
        _publish(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already once published


def note(dataset: Dataset, origin: str) -> str:
    """The README.md written beside the files: source, commit, licence, citation and checksums."""
    rows = "".join(f"| {f.name} | `{f.path}` ({f.how}) | {f.size:,} | {f.sha256} |\n" for f in dataset.files)
    held_out = (f"Not fetched: {dataset.held_out}; {NOT_FETCHED_WHY}." if dataset.held_out
                else "Nothing is held out: these are the whole files.")
    return (f"# {dataset.name}\n\n"
            f"Written by `attnlab data get {dataset.name}` from {origin}.\n\n"
            f"- Source: https://github.com/{dataset.repo} at commit `{dataset.commit}`\n"
            f"- Licence: {dataset.licence}\n"
            f"- Cite: {dataset.citation}\n"
            f"- {held_out}\n\n"
            f"| file | path in the repository | bytes | sha256 |\n| --- | --- | --- | --- |\n{rows}")


def _download(url: str, timeout: float) -> bytes:
    """The body at ``url``; a network or HTTP failure is one DataError line."""
    hint = "(no network? --from DIR takes the files from a local copy)"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as err:
        raise DataError(f"cannot download {url}: HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        raise DataError(f"cannot download {url}: {err.reason} {hint}") from None
    except (OSError, http.client.HTTPException) as err:  # a timeout or a dropped connection mid-body
        raise DataError(f"cannot download {url}: {err or type(err).__name__} {hint}") from None


def _read(path: Path, dataset: Dataset) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        names = ", ".join(f.name for f in dataset.files)
        raise DataError(f"{path}: no such file (--from takes a folder holding {names})") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None


def _publish(staged: Path, out: Path) -> None:
    """Move the verified files into ``out``: the whole folder at once when ``out`` is new or empty,
    else file by file (each an atomic rename), leaving the folder's other files alone."""
    if not out.is_dir() or all(is_leftover(p) for p in out.iterdir()):
        publish_dir(staged, out)
        return
    for file in sorted(p for p in staged.rglob("*") if p.is_file()):
        target = out / file.relative_to(staged)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
