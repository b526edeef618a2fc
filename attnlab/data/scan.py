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
"""

from __future__ import annotations

import itertools

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
