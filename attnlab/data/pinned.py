"""What a pinned data set is: a :class:`Dataset` names a public GitHub repository at a pinned commit
and, for each of its files (:class:`SourceFile`), the path there, the name it is written under, and
the sha256 of its final content (after the transform, if any: gunzip, or "keep the first N lines"),
which :meth:`SourceFile.verified` checks; :func:`manifest_files` reads the files of a ``sha256sum``
manifest. The standard data sets themselves, pinned so, are data/sources.py's."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import DataError

GITHUB_RAW = "https://raw.githubusercontent.com"  # BASE/OWNER/REPO/COMMIT/PATH; --base-url replaces it


@dataclass(frozen=True)
class SourceFile:
    """One file of a data set: its path in the repository, and what it must be once fetched."""

    path: str  # in the repository, at the data set's commit
    name: str  # in the output folder
    size: int | None  # bytes of the final content (stored: of the repository's bytes);
    # None: a manifest of checksums alone pins the file (FSDD)
    sha256: str  # of the final content (stored: of the repository's bytes)
    gunzip: bool = False  # the repository holds it gzipped
    first_lines: int | None = None  # keep only the first N lines ('\n'-terminated) of the file
    test: bool = False  # a test split: --dev-only leaves it out, a --from copy may lack it
    stored: bool = False  # the pin is of the bytes as the repository stores them (a .gz)

    @property
    def local_name(self) -> str:
        """The file's name in a local copy (--from): the output name, or the repository's own file
        name for a file pinned as stored (the .gz, which is what the checksum can verify)."""
        return Path(self.path).name if self.stored else self.name

    def verified(self, content: bytes, source: str, dataset: str, as_stored: bool = True) -> bytes:
        """The final content, its checksum verified (a mismatch is a DataError naming ``source``), from
        the repository's bytes, or (not ``as_stored``: a local copy's file) the final content itself."""
        final = self.derive(content, source) if as_stored else content
        digest = hashlib.sha256(content if self.stored else final).hexdigest()
        if digest != self.sha256:
            raise DataError(
                f"{source}: sha256 {digest} is not the pinned {self.sha256} of {dataset}/{self.name}; "
                f"nothing was written"
            )
        return final

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
                raw = b"\n".join(lines[: self.first_lines]) + b"\n"
        return raw

    @property
    def how(self) -> str:
        """How the file was derived from the repository's, in words."""
        steps = (
            (["gunzipped"] if self.gunzip else [])
            + ([f"first {self.first_lines:,} lines"] if self.first_lines is not None else [])
            + (["size and sha256 of the stored file"] if self.stored else [])
        )
        return ", ".join(steps) or "bytes unchanged"


@dataclass(frozen=True)
class Dataset:
    """A data set: a GitHub repository at a pinned commit, the files taken from it, and its terms."""

    name: str
    repo: str  # OWNER/NAME on GitHub
    commit: str  # 40 hex digits
    licence: str  # one line
    citation: str
    files: tuple[SourceFile, ...]
    test_sets: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # name -> its files' names
    flat_copy: bool = False  # a --from folder may hold its files by their bare names (a folder of recordings)

    @property
    def size(self) -> int | None:
        """The bytes of all its files, or None when a manifest pins them by checksum alone."""
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(s for s in sizes if s is not None)

    def chosen(self, dev_only: bool) -> tuple[SourceFile, ...]:
        """The files ``data get`` writes: all, or with ``dev_only`` those that are not test splits."""
        return tuple(f for f in self.files if not (dev_only and f.test))

    def url(self, file: SourceFile, base_url: str = GITHUB_RAW) -> str:
        return f"{base_url.rstrip('/')}/{self.repo}/{self.commit}/{file.path}"


def manifest_files(manifest: str, test_below: int = 5) -> tuple[SourceFile, ...]:
    """The files of a ``sha256sum``-style manifest of recordings (``SHA256  recordings/D_SPEAKER_I.wav``
    per line), each written to train/ or, when its index I is below ``test_below``, test/: FSDD's
    official split ("recordings numbered 0-4 are in the test and 5-49 are in the training set")."""
    files = []
    for number, line in enumerate(manifest.splitlines(), 1):
        match = re.fullmatch(r"([0-9a-f]{64})  (recordings/\d+_[a-z]+_(\d+)\.wav)", line)
        if match is None:  # the manifest ships inside the package: a bad line is a defect, not user input
            raise ValueError(f"manifest line {number} is not 'SHA256  recordings/DIGIT_SPEAKER_INDEX.wav': {line!r}")
        sha256, path, index = match.groups()
        test = int(index) < test_below
        files.append(SourceFile(path, f"{'test' if test else 'train'}/{Path(path).name}", None, sha256, test=test))
    return tuple(sorted(files, key=lambda f: (f.test, f.name)))  # the training files first
