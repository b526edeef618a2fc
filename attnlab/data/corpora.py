"""Corpora: reading parallel text, plain text, labelled TSV and SCAN files, and the built-in
generated pair sets.

Every reader raises a :class:`DataError` that names the file and line of the first problem.
Pairs are ``(source, target)`` strings; tokenisation and length filtering come after reading.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.data.scan import scan_commands, scan_split
from attnlab.data.sources import no_such_file
from attnlab.errors import DataError

Pair = tuple[str, str]
GENERATORS = ("scan", "copy", "reverse", "sort", "addition")  # the built-in generated pair sets (data.generator.name)
MAX_LINE_CHARS = 65_536  # far over any sentence: a longer line is the wrong file, not data


def decode_utf8(data: bytes, name: str) -> str:
    """Bytes from ``name`` (a file, or <stdin>) as text, refusing what is not UTF-8 or holds NUL
    bytes (a binary file)."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not text
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{name}:{line}: not valid UTF-8 (byte {err.start})") from None
    nul = text.find("\0")
    if nul >= 0:
        raise DataError(f"{name}:{text.count(chr(10), 0, nul) + 1}: contains a NUL byte (a binary file, not text)")
    return text


def check_lines(lines: list[str], name: str, allow_empty: bool) -> list[str]:
    """Refuse lines over MAX_LINE_CHARS and, unless ``allow_empty``, empty lines (naming the line)."""
    for n, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_CHARS:
            raise DataError(
                f"{name}:{n}: a line of {len(line):,} characters (the limit is {MAX_LINE_CHARS:,}); "
                f"is this the right file?"
            )
        if not allow_empty and not line.strip():
            raise DataError(f"{name}:{n}: empty line (every line of a corpus must hold a sentence)")
    return lines


def split_lines(text: str) -> list[str]:
    """Lines split at '\n' only (str.splitlines would also split inside a line at U+0085, U+2028,
    form feeds...), without a trailing '\r'."""
    if not text:
        return []
    return [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]


def read_text(path: str | Path) -> str:
    """The whole file as text, refusing what is not UTF-8."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise no_such_file(Path(path)) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None
    return decode_utf8(data, str(path))


def read_lines(path: str | Path, allow_empty: bool = False) -> list[str]:
    """The file's lines (see :func:`split_lines`), checked by :func:`check_lines`; an empty file is
    an error. ``allow_empty`` keeps empty lines (text to translate: the output keeps the alignment)."""
    lines = split_lines(read_text(path))
    if not lines:
        raise DataError(f"{path}: file is empty")
    return check_lines(lines, str(path), allow_empty)


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> list[Pair]:
    """Two line-aligned files: line i of one translates line i of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; parallel files must align")
    return list(zip(src, tgt))


def read_tsv(path: str | Path) -> list[Pair]:
    """One pair per line: source TAB target."""
    pairs = []
    for n, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}:{n}: expected 2 tab-separated fields (source, target), found {len(fields)}")
        pairs.append((fields[0], fields[1]))
    return pairs


@dataclass(frozen=True)
class Labelled:
    """One labelled example: a text, or a pair of texts (BERT's sentences A and B), and its label."""

    text_a: str
    text_b: str | None
    label: str
    line: int  # where it is in its file


def read_labelled(path: str | Path, header: bool = False) -> list[Labelled]:
    """``text TAB label`` or ``text_a TAB text_b TAB label`` lines, the same number of fields on
    every line; ``header``: the first line names the columns and is skipped."""
    lines = read_lines(path)
    first = 1 + header
    examples, width = [], None
    for n, line in enumerate(lines[header:], start=first):
        fields = line.split("\t")
        if len(fields) not in (2, 3) or (width is not None and len(fields) != width):
            expected = {
                None: "2 (text, label) or 3 (text_a, text_b, label)",
                2: f"2 (text, label), as on line {first}",
                3: f"3 (text_a, text_b, label), as on line {first}",
            }[width]
            raise DataError(f"{path}:{n}: found {len(fields)} tab-separated fields; expected {expected}")
        width = len(fields)
        label = fields[-1].strip()
        if not label:
            raise DataError(f"{path}:{n}: empty label")
        if not all(f.strip() for f in fields[:-1]):
            raise DataError(f"{path}:{n}: empty text")
        examples.append(Labelled(fields[0], fields[1] if width == 3 else None, label, n))
    if not examples:
        raise DataError(f"{path}: no examples after the header line")
    return examples


def read_scan(path: str | Path) -> list[Pair]:
    """SCAN's format: ``IN: <command> OUT: <actions>`` on each line."""
    pairs = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.startswith("IN: ") or " OUT: " not in line:
            raise DataError(f"{path}:{n}: expected 'IN: <command> OUT: <actions>'")
        command, actions = line[len("IN: ") :].split(" OUT: ", 1)
        pairs.append((command.strip(), actions.strip()))
    return pairs


SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"  # the tokens of the copy / reverse / sort sequences


def _symbols(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(SYMBOLS) for _ in range(n)]


def _number(rng: random.Random, n: int) -> int:
    """A number of ``n`` digits (no leading zero)."""
    return int(rng.choice("123456789") + "".join(rng.choice("0123456789") for _ in range(n - 1)))


def _addition(rng: random.Random, n: int) -> Pair:
    a, b = _number(rng, n), _number(rng, n)
    return f"{' '.join(str(a))} + {' '.join(str(b))}", " ".join(str(a + b))


# the generated sequence tasks: a length n -> (source, target)
SEQUENCE_TASKS = {
    "copy": lambda rng, n: (" ".join(seq := _symbols(rng, n)), " ".join(seq)),
    "reverse": lambda rng, n: (" ".join(seq := _symbols(rng, n)), " ".join(seq[::-1])),
    "sort": lambda rng, n: (" ".join(seq := _symbols(rng, n)), " ".join(sorted(seq))),
    "addition": _addition,
}


def _drawn_pairs(
    generator: str, rng: random.Random, count: int, lengths: tuple[int, int], seen: set[str]
) -> list[Pair]:
    """``count`` pairs of a sequence task, each of a length drawn from ``lengths`` (inclusive), no
    source twice (nor one in ``seen``, which they join)."""
    pairs: list[Pair] = []
    repeats = 0
    while len(pairs) < count:
        src, tgt = SEQUENCE_TASKS[generator](rng, rng.randint(*lengths))
        if src in seen:
            repeats += 1
            if repeats > 100 * count + 1000:
                raise DataError(
                    f"data.generator.name '{generator}': cannot draw {count} distinct sequences of lengths "
                    f"{lengths[0]}-{lengths[1]}; widen the lengths or ask for fewer pairs"
                )
            continue
        seen.add(src)
        pairs.append((src, tgt))
    return pairs


def generated_pairs(
    generator: str,
    seed: int,
    n_train: int | None,
    n_valid: int,
    n_test: int,
    min_len: int = 3,
    max_len: int = 12,
    scan_split_name: str | None = None,
    test_lengths: tuple[int, int] | None = None,
) -> dict[str, list[Pair]]:
    """Seeded, reproducible splits of a generated set of pairs.

    ``scan``: the 20,910 SCAN commands, shuffled and cut into test, valid and train (the rest, or
    ``n_train``); with ``scan_split_name``, that split's test (scan.SCAN_SPLITS), and its training
    pairs shuffled and cut into valid and train. ``copy`` / ``reverse`` / ``sort``: sequences of
    ``min_len``..``max_len`` digits and letters, mapped to themselves, reversed or sorted;
    ``addition``: two numbers of that many digits each, 'a1 a2 + b1 b2' -> the digits of the sum.
    Splits do not share a source. ``test_lengths`` (lowest, highest): the test split's lengths, for
    length generalisation (train and valid keep min_len..max_len).
    """
    rng = random.Random(seed)
    if scan_split_name is not None:
        train, test = scan_split(scan_split_name, seed)
        rng.shuffle(train)
        rest = train[n_valid:]
        return {"train": rest if n_train is None else rest[:n_train], "valid": train[:n_valid], "test": test}
    if generator == "scan":
        pairs = scan_commands()
        rng.shuffle(pairs)
        test, valid, rest = pairs[:n_test], pairs[n_test : n_test + n_valid], pairs[n_test + n_valid :]
        return {"train": rest if n_train is None else rest[:n_train], "valid": valid, "test": test}
    seen: set[str] = set()
    test = _drawn_pairs(generator, rng, n_test, test_lengths or (min_len, max_len), seen)
    valid = _drawn_pairs(generator, rng, n_valid, (min_len, max_len), seen)
    return {"train": _drawn_pairs(generator, rng, n_train or 0, (min_len, max_len), seen), "valid": valid, "test": test}


@dataclass
class FilterReport:
    """How many pairs a filter kept, and how many it dropped for each reason."""

    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def __str__(self) -> str:
        if not self.dropped:
            return f"kept all {self.kept:,} pairs"
        reasons = ", ".join(f"{n:,} {why}" for why, n in self.dropped.most_common())
        return f"kept {self.kept:,} pairs, dropped {sum(self.dropped.values()):,} ({reasons})"


def filter_by_length(
    pairs: list[tuple[list[int], list[int]]], max_src_len: int, max_tgt_len: int
) -> tuple[list[int], FilterReport]:
    """Indices of the tokenised pairs to keep: non-empty and within the length limits."""
    keep, report = [], FilterReport()
    for i, (src, tgt) in enumerate(pairs):
        if not src or not tgt:
            report.dropped["with an empty side"] += 1
        elif len(src) > max_src_len:
            report.dropped[f"with source over {max_src_len} tokens"] += 1
        elif len(tgt) > max_tgt_len:
            report.dropped[f"with target over {max_tgt_len} tokens"] += 1
        else:
            keep.append(i)
    report.kept = len(keep)
    return keep, report


def read_input_lines(path: str | None, doing: str = "translate") -> list[str]:
    """Lines of a command's --input FILE, or of standard input: read, checked and split the same
    way. Empty input gives empty output, with a note that there is nothing to do (``doing``: the
    command's verb), as it would from any filter."""
    name = path or "<stdin>"
    text = decode_utf8(sys.stdin.buffer.read(), name) if path is None else read_text(path)
    lines = check_lines(split_lines(text), name, allow_empty=True)
    if not lines:
        print(f"note: {name} is empty: nothing to {doing}", file=sys.stderr)
    return lines
