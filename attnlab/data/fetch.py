"""`attnlab data get`'s writing: :func:`fetch` downloads a data set's files (data/sources.py says
where each comes from and its checksum), or takes them from a local copy (``--from``: this project's
own copy, or a clone of the upstream repository, from which the derived files are made), verifies
every checksum in a staging folder before anything is written, and publishes the folder at once,
with a README.md saying where it came from (:func:`note`): a failed or mismatched download leaves
nothing behind. A local copy that lacks a test file is not an error: the files it has are written
and the missing ones are named, in the command's output and in the note.
"""

from __future__ import annotations

import http.client
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from attnlab.data.pinned import GITHUB_RAW, Dataset, SourceFile
from attnlab.data.sources import listing
from attnlab.errors import DataError, UsageError
from attnlab.files import atomic_write_bytes, atomic_write_text, is_leftover, publish_dir, staging_dir

TIMEOUT = 60.0  # seconds without a byte before a download is given up
NOTE = "README.md"  # written beside the files: source, commit, licence, checksums


def fetch(
    dataset: Dataset,
    out: str | Path,
    *,
    base_url: str = GITHUB_RAW,
    local: str | Path | None = None,
    force: bool = False,
    dev_only: bool = False,
    timeout: float = TIMEOUT,
    log: Callable[[str], None] = lambda line: None,
) -> list[SourceFile]:
    """Write ``dataset``'s files (with ``dev_only``, not its test files) and its README.md note into
    the folder ``out``; returns the files written.

    The files are downloaded from ``base_url`` (laid out as BASE/OWNER/REPO/COMMIT/PATH), or read
    from the folder ``local`` (see :func:`find_local`): a copy of the final files under their
    output names, or a clone of the repository, from whose files the derived ones are made
    (gunzipped, cut to their first lines) and verified. A test file that ``local`` lacks is left out and named in
    the log and the note; a missing development file is an error. Every sha256 is verified in a
    staging folder before ``out`` is published. An existing, non-empty ``out`` is refused unless
    ``force``; then only the files of the same names are replaced in it.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(not is_leftover(p) for p in out.iterdir()) and not force:
        raise UsageError(f"{out} already exists and is not empty; pass --force to replace its {dataset.name} files")
    files = dataset.chosen(dev_only)
    if local is not None:
        local = Path(local)
        if not local.is_dir():
            raise UsageError(f"--from {local} is not a folder")
        origin = str(local)
        found = {f: find_local(local, f, dataset.flat_copy) for f in files}
        absent = [f for f in files if f.test and found[f] is None]
        if absent:
            log(
                f"not in {local}, left out: {listing([f.local_name for f in absent])} (test splits; a download "
                f"fetches them)"
            )
        files = tuple(f for f in files if f not in absent)
    else:
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"--base-url must start with http:// or https:// (got {base_url!r})")
        origin, absent = base_url, []
    staged = staging_dir(out)
    downloaded: dict[str, bytes] = {}  # url -> body: ETT's whole file and its first months are one download
    sizes: dict[str, int] = {}  # name -> bytes written: the note's column where the pin has no size (FSDD)
    try:
        for file in files:
            if local is not None:
                path, as_stored = found[file] or (local / file.local_name, file.stored)
                source, raw = str(path), _read(path, dataset)
            else:
                source = dataset.url(file, base_url)
                if source not in downloaded:
                    log(f"downloading {source}")
                    downloaded[source] = _download(source, timeout)
                raw = downloaded[source]
                as_stored = True
            data = file.verified(raw, source, dataset.name, as_stored=as_stored)
            atomic_write_bytes(staged / file.name, data)
            sizes[file.name] = len(data)
            log(f"{file.name}: {len(data):,} bytes, sha256 verified")
        atomic_write_text(staged / NOTE, note(dataset, origin, files, absent, sizes))
        _publish(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already once published
    return list(files)


def find_local(local: Path, file: SourceFile, flat: bool = False) -> tuple[Path, bool] | None:
    """Where the folder ``local`` holds ``file``, and whether as the repository stores it: under its
    output name (the final content; a file pinned as stored: the repository's .gz), else at its path
    in the repository (a clone at the pinned commit), else, for a data set whose files the folder may
    hold flat (``flat_copy``: FSDD's recordings), under the repository's file name at its top; None
    when in none of them."""
    candidates = (
        (local / file.local_name, file.stored),
        (local / file.path, True),
        *(((local / Path(file.path).name, True),) if flat else ()),
    )
    return next(((path, stored) for path, stored in candidates if path.is_file()), None)


def note(
    dataset: Dataset,
    origin: str,
    files: tuple[SourceFile, ...],
    absent: list[SourceFile],
    sizes: dict[str, int] | None = None,
) -> str:
    """The README.md written beside the ``files``: source, commit, licence, citation, checksums, and
    which of the data set's files are not there (left out by --dev-only, or ``absent`` from --from).
    A file pinned by its checksum alone (no size) shows the bytes written, from ``sizes``."""
    sizes = sizes or {}
    rows = "".join(
        f"| {f.name} | `{f.path}` ({f.how}) | {f.size if f.size is not None else sizes.get(f.name, 0):,} | {f.sha256} |\n"
        for f in files
    )
    left = [f for f in dataset.files if f not in files]
    missing = (
        "Every file of the data set is here, test splits included."
        if not left
        else f"Not here: {listing([f.name for f in left])} ("
        + (f"not in {origin}" if absent else "left out by --dev-only")
        + f"; `attnlab data get {dataset.name} --force` downloads them)."
    )
    return (
        f"# {dataset.name}\n\n"
        f"Written by `attnlab data get {dataset.name}` from {origin}.\n\n"
        f"- Source: https://github.com/{dataset.repo} at commit `{dataset.commit}`\n"
        f"- Licence: {dataset.licence}\n"
        f"- Cite: {dataset.citation}\n"
        f"- {missing}\n\n"
        f"| file | path in the repository | bytes | sha256 |\n| --- | --- | --- | --- |\n{rows}"
    )


def _download(url: str, timeout: float) -> bytes:
    """The body at ``url``; a network or HTTP failure is one DataError line."""
    hint = "(no network? --from DIR takes the files from a local copy)"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body
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
        names = listing([f.local_name for f in dataset.files])
        raise DataError(
            f"{path}: no such file (--from takes a folder holding {names}, or a clone of "
            f"https://github.com/{dataset.repo})"
        ) from None
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
