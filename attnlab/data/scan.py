"""SCAN (Lake & Baroni 2018): navigation commands and the action sequences they mean.

The grammar, as published:

    C -> S and S | S after S | S
    S -> V twice | V thrice | V
    V -> D opposite {left, right} | D around {left, right} | D | U       (D here: U or 'turn')
    D -> U left | U right | turn left | turn right
    U -> walk | look | run | jump

and its meaning: a primitive is its action (walk -> I_WALK; 'turn' alone does nothing);
'x left' turns left, then does x; 'x opposite left' turns left twice, then does x; 'x around left'
does (turn left, x) four times; 'twice' / 'thrice' repeat; 'a and b' is a then b; 'a after b' is
b then a. There are 20,910 commands in all.

The splits of the generalisation experiments, each derived from its rule (``scan_split``):

- Lake & Baroni (2018): ``simple``, a random 80/20 split (16,728 / 4,182; seeded here, so not the
  published draw); ``length``, every command of at most 22 actions in train (16,990 / 3,920, the
  published training set exactly); ``add_prim_jump`` and ``add_prim_turn_left``, every command
  without the primitive in train, the bare primitive repeated to make up the published count
  (14,670 / 7,706 and 21,890 / 1,208), every other command with it in test.
- Loula et al. (2018), templates held out of training: ``template_jump_around_right`` (commands
  with "jump around right"), ``template_around_right``, ``template_opposite_right`` and
  ``template_right`` (commands with "P around right", "P opposite right", "P right", P any of the
  four primitives walk, look, run, jump). As in their published files, the commands that apply the
  template's modifier to ``turn`` ("turn around right" for both around-right splits, "turn opposite
  right", "turn right") are in neither half: 1,209 commands, leaving 19,701, split 15,225 / 4,476
  (18,528 / 1,173 for jump around right).
"""

from __future__ import annotations

import itertools
import random
from typing import Callable

Pair = tuple[str, str]  # (command, actions)

PRIMITIVES = {"walk": ["I_WALK"], "look": ["I_LOOK"], "run": ["I_RUN"], "jump": ["I_JUMP"]}
TURNS = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}
REPEATS = {"twice": 2, "thrice": 3}


def _verb_phrases() -> list[tuple[str, list[str]]]:
    """Every V with its meaning (34 of them)."""
    phrases = [(u, action) for u, action in PRIMITIVES.items()]
    actors = [*PRIMITIVES.items(), ("turn", [])]  # 'turn' takes a direction but does nothing itself
    for (u, action), (direction, turn) in itertools.product(actors, TURNS.items()):
        phrases.append((f"{u} {direction}", [turn] + action))
        phrases.append((f"{u} opposite {direction}", [turn, turn] + action))
        phrases.append((f"{u} around {direction}", ([turn] + action) * 4))
    return phrases


def _sentences() -> list[tuple[str, list[str]]]:
    """Every S with its meaning (102 of them)."""
    verbs = _verb_phrases()
    out = list(verbs)
    for (v, meaning), (word, n) in itertools.product(verbs, REPEATS.items()):
        out.append((f"{v} {word}", meaning * n))
    return out


def scan_commands() -> list[tuple[str, str]]:
    """All 20,910 (command, actions) pairs of the grammar, in a fixed order."""
    sentences = _sentences()
    pairs = [(s, " ".join(m)) for s, m in sentences]
    for (s1, m1), (s2, m2) in itertools.product(sentences, sentences):
        pairs.append((f"{s1} and {s2}", " ".join(m1 + m2)))
        pairs.append((f"{s1} after {s2}", " ".join(m2 + m1)))
    return pairs


def _contains(command: str, phrase: str) -> bool:
    """``phrase`` occurs in ``command`` as whole words."""
    return f" {phrase} " in f" {command} "


def _simple(pairs: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
    """A seeded random 80/20 split (20% of 20,910 = 4,182 test)."""
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    n_test = round(0.2 * len(pairs))
    return shuffled[n_test:], shuffled[:n_test]


def _length(pairs: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
    """Train: every command of at most 22 actions; test: the longer ones."""
    return [p for p in pairs if len(p[1].split()) <= 22], [p for p in pairs if len(p[1].split()) > 22]


def _added_primitive(primitive: str, train_size: int) -> Callable[[list[Pair], int], tuple[list[Pair], list[Pair]]]:
    """Train: every command without ``primitive``, and the bare primitive repeated up to ``train_size``
    commands; test: every other command with it."""

    def split(pairs: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
        bare = next(p for p in pairs if p[0] == primitive)
        without = [p for p in pairs if not _contains(p[0], primitive)]
        return without + [bare] * (train_size - len(without)), [
            p for p in pairs if _contains(p[0], primitive) and p[0] != primitive
        ]

    return split


def _template(phrases: list[str], left_out: str) -> Callable[[list[Pair], int], tuple[list[Pair], list[Pair]]]:
    """Test: every command with one of ``phrases``; train: the rest; neither: the commands with
    ``left_out`` (the template applied to 'turn', which the published files leave out)."""

    def split(pairs: list[Pair], seed: int) -> tuple[list[Pair], list[Pair]]:
        kept = [p for p in pairs if not _contains(p[0], left_out)]
        held = [any(_contains(c, phrase) for phrase in phrases) for c, _ in kept]
        return [p for p, h in zip(kept, held) if not h], [p for p, h in zip(kept, held) if h]

    return split


SCAN_SPLITS: dict[str, Callable[[list[Pair], int], tuple[list[Pair], list[Pair]]]] = {
    "simple": _simple,
    "length": _length,
    "add_prim_jump": _added_primitive("jump", 14_670),
    "add_prim_turn_left": _added_primitive("turn left", 21_890),
    "template_jump_around_right": _template(["jump around right"], "turn around right"),
    "template_around_right": _template([f"{p} around right" for p in PRIMITIVES], "turn around right"),
    "template_opposite_right": _template([f"{p} opposite right" for p in PRIMITIVES], "turn opposite right"),
    "template_right": _template([f"{p} right" for p in PRIMITIVES], "turn right"),
}


def scan_split(name: str, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, test) pairs of the split ``name`` (SCAN_SPLITS); ``seed`` draws the ``simple`` split."""
    return SCAN_SPLITS[name](scan_commands(), seed)


def scan_lines(pairs: list[Pair]) -> str:
    """The published format: ``IN: <command> OUT: <actions>``, one pair a line."""
    return "".join(f"IN: {command} OUT: {actions}\n" for command, actions in pairs)
