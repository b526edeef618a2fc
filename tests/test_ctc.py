"""CTC decoding (decode/ctc.py, Graves et al. 2006) against an exhaustive search over every path,
PyTorch's ctc_loss and tables worked out by hand; the CTC search (decode/spec.py) through a model
that gives a fixed table."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.decode.ctc import ctc_greedy, ctc_prefix_beam_search
from attnlab.decode.spec import CTC
from attnlab.errors import UsageError
from attnlab.nn.interfaces import CTCModel

BLANK = 0
SHAPES = [(4, 3), (4, 4), (5, 3), (5, 4)]  # (T, V) of the tables searched exhaustively (V^T paths)
CASES = [(seed, t, v) for seed in range(3) for t, v in SHAPES]


def table(seed: int, frames: int, symbols: int, sharpness: float = 2.0) -> Tensor:
    """A seeded (T, V) table of log-probabilities (float64); ``sharpness`` scales the logits."""
    logits = torch.randn(frames, symbols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (sharpness * logits).log_softmax(-1)


def labelling(path: tuple[int, ...]) -> tuple[int, ...]:
    """The path's repeats merged, then its blanks dropped (written here apart from decode/ctc.py's)."""
    return tuple(symbol for symbol, _ in itertools.groupby(path) if symbol != BLANK)


def path_log_prob(log_probs: Tensor, path: tuple[int, ...]) -> float:
    return sum(log_probs[t, symbol].item() for t, symbol in enumerate(path))


def exhaustive(log_probs: Tensor) -> dict[tuple[int, ...], float]:
    """Every labelling of the table's T frames -> its probability: the sum over all V^T paths."""
    frames, symbols = log_probs.shape
    mass: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(symbols), repeat=frames):
        key = labelling(path)
        mass[key] = mass.get(key, 0.0) + math.exp(path_log_prob(log_probs, path))
    return mass


def ranked(mass: dict[tuple[int, ...], float]) -> list[tuple[list[int], float]]:
    """Labellings best first (ties: the smaller labelling first), with their log-probabilities."""
    order = sorted(mass, key=lambda key: (-mass[key], key))
    return [(list(key), math.log(mass[key])) for key in order]


def pruned_on_paths(log_probs: Tensor, width: int) -> list[tuple[list[int], float]]:
    """The prefix beam search done on whole paths: after each frame only the paths whose labelling so
    far is among the ``width`` likeliest go on, so a labelling's mass is that of its paths that
    never passed through a pruned prefix."""
    frames, symbols = log_probs.shape
    kept: list[tuple[int, ...]] = [()]
    beam: list[tuple[int, ...]] = [()]
    mass: dict[tuple[int, ...], float] = {(): 1.0}
    for t in range(frames):
        paths = [path + (symbol,) for path in kept for symbol in range(symbols)]
        mass = {}
        for path in paths:
            mass[labelling(path)] = mass.get(labelling(path), 0.0) + math.exp(path_log_prob(log_probs, path))
        beam = sorted(mass, key=lambda key: (-mass[key], key))[:width]
        kept = [path for path in paths if labelling(path) in beam]
    return [(list(key), math.log(mass[key])) for key in beam]


def assert_same(found: list[tuple[list[int], float]], expected: list[tuple[list[int], float]]) -> None:
    assert [ids for ids, _ in found] == [ids for ids, _ in expected]
    assert [score for _, score in found] == pytest.approx([score for _, score in expected], abs=1e-5)


# -- against the exhaustive search -----------------------------------------------------------------


@pytest.mark.parametrize("seed, frames, symbols", CASES)
def test_a_beam_wide_enough_for_every_labelling_gives_the_exhaustive_ranking_and_probabilities(seed, frames, symbols):
    log_probs = table(seed, frames, symbols)
    expected = ranked(exhaustive(log_probs))
    found = ctc_prefix_beam_search(log_probs, frames, BLANK, len(expected), len(expected))
    assert_same(found, expected)
    assert math.log(sum(math.exp(score) for _, score in found)) == pytest.approx(0.0, abs=1e-9)  # all the mass


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("seed, frames, symbols", CASES)
def test_a_narrow_beam_keeps_the_mass_of_the_paths_it_never_pruned(seed, frames, symbols, width):
    """Pruned, a labelling's score is a lower bound of its probability: exactly the mass of its paths
    that never passed through a pruned prefix."""
    log_probs = table(seed, frames, symbols)
    probability = exhaustive(log_probs)
    found = ctc_prefix_beam_search(log_probs, frames, BLANK, width, width)
    best, score = found[0]
    assert tuple(best) in probability
    assert score <= math.log(probability[tuple(best)]) + 1e-9
    assert_same(found, pruned_on_paths(log_probs, width))


def test_a_narrow_beam_can_miss_mass_and_the_best_labelling():
    """The bound is not always reached: at width 1, seed 0's best labelling (3 2 3) is lost, and the
    one found (3) lacks some of its mass."""
    log_probs = table(0, 4, 4)
    probability = exhaustive(log_probs)
    assert ranked(probability)[0][0] == [3, 2, 3]
    [(best, score)] = ctc_prefix_beam_search(log_probs, 4, BLANK, 1, 1)
    assert best == [3]
    assert score < math.log(probability[(3,)]) - 1e-3


@pytest.mark.parametrize("seed, frames, symbols", CASES)
def test_greedy_is_the_collapsed_best_path(seed, frames, symbols):
    log_probs = table(seed, frames, symbols)
    paths = itertools.product(range(symbols), repeat=frames)
    best_path = max(paths, key=lambda path: path_log_prob(log_probs, path))
    assert ctc_greedy(log_probs[None], torch.tensor([frames]), BLANK) == [list(labelling(best_path))]


def test_greedy_decodes_a_batch_row_by_row():
    tables = [table(seed, 5, 4) for seed in range(4)]
    batch = torch.stack(tables)  # (4, 5, 4)
    rows = [ctc_greedy(t[None], torch.tensor([5]), BLANK)[0] for t in tables]
    assert ctc_greedy(batch, torch.full((4,), 5), BLANK) == rows
    assert len({tuple(row) for row in rows}) > 1  # the rows differ: a mix-up would show


# -- against PyTorch's CTC loss ---------------------------------------------------------------------


def ctc_log_likelihood(log_probs: Tensor, targets: list[list[int]]) -> list[float]:
    """log P(target | table) of each target: minus torch's CTC loss."""
    frames = log_probs.shape[0]
    longest = max(1, *(len(t) for t in targets))
    padded = torch.tensor([t + [1] * (longest - len(t)) for t in targets])
    losses = F.ctc_loss(
        log_probs[:, None].expand(-1, len(targets), -1),  # (T, N, V)
        padded,
        torch.full((len(targets),), frames),
        torch.tensor([len(t) for t in targets]),
        blank=BLANK,
        reduction="none",
    )
    return (-losses).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_each_hypothesis_of_an_unpruned_beam_scores_as_ctc_loss_says(seed):
    frames, symbols = 6, 4
    log_probs = table(seed, frames, symbols)
    every = sum((symbols - 1) ** n for n in range(frames + 1))  # the labellings of at most T symbols
    found = ctc_prefix_beam_search(log_probs, frames, BLANK, every, 20)
    assert len(found) == 20
    scores = [score for _, score in found]
    assert scores == sorted(scores, reverse=True)
    assert scores == pytest.approx(ctc_log_likelihood(log_probs, [ids for ids, _ in found]), abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_a_pruned_beams_scores_are_at_most_ctc_loss_likelihood(seed):
    frames, symbols = 12, 5
    log_probs = table(seed, frames, symbols, sharpness=3.0)
    found = ctc_prefix_beam_search(log_probs, frames, BLANK, 8, 8)
    reference = ctc_log_likelihood(log_probs, [ids for ids, _ in found])
    assert len({tuple(ids) for ids, _ in found}) == 8
    assert all(score <= ref + 1e-9 for (_, score), ref in zip(found, reference))


# -- repeated symbols, by hand ----------------------------------------------------------------------


def probabilities(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.float64).log()


def test_a_repeat_needs_a_blank_between():
    """Blank and a (id 1) over three frames. Of the 8 paths only a-a gives "a a"; --- gives nothing;
    the other six give "a". The best path a-a is not the best labelling."""
    log_probs = probabilities([[0.4, 0.6], [0.55, 0.45], [0.4, 0.6]])
    a_a, nothing = 0.6 * 0.55 * 0.6, 0.4 * 0.55 * 0.4
    found = ctc_prefix_beam_search(log_probs, 3, BLANK, 3, 3)
    assert_same(found, [([1], math.log(1 - a_a - nothing)), ([1, 1], math.log(a_a)), ([], math.log(nothing))])
    assert ctc_greedy(log_probs[None], torch.tensor([3]), BLANK) == [[1, 1]]


def test_a_repeat_without_a_blank_is_one_symbol():
    log_probs = probabilities([[0.1, 0.9], [0.1, 0.9], [0.8, 0.2]])  # best path a a -
    assert ctc_greedy(log_probs[None], torch.tensor([3]), BLANK) == [[1]]
    found = ctc_prefix_beam_search(log_probs, 3, BLANK, 3, 3)
    a_a = 0.9 * 0.1 * 0.2  # a - a
    assert found[1] == ([1, 1], pytest.approx(math.log(a_a)))
    assert found[0] == ([1], pytest.approx(math.log(1 - a_a - 0.1 * 0.1 * 0.8)))


def test_equal_scores_rank_the_smaller_labelling_first():
    log_probs = probabilities([[0.2, 0.4, 0.4]])  # "a" and "b" equally likely
    assert ctc_prefix_beam_search(log_probs, 1, BLANK, 3, 3) == [
        ([1], pytest.approx(math.log(0.4))),
        ([2], pytest.approx(math.log(0.4))),
        ([], pytest.approx(math.log(0.2))),
    ]
    assert ctc_prefix_beam_search(log_probs, 1, BLANK, 1, 1) == [([1], pytest.approx(math.log(0.4)))]


# -- lengths: frames past a row's length are not read -----------------------------------------------


def padded_pair() -> tuple[Tensor, Tensor, Tensor]:
    """Two rows of 5 frames, the first valid for 3; its last two frames favour symbol 2 strongly."""
    short, long = table(10, 3, 4), table(11, 5, 4)
    padding = torch.tensor([[-9.0, -9.0, 0.0, -9.0]] * 2, dtype=torch.float64).log_softmax(-1)
    return short, long, torch.stack([torch.cat([short, padding]), long])


def test_frames_past_a_rows_length_do_not_change_its_output():
    short, long, batch = padded_pair()
    lengths = torch.tensor([3, 5])
    assert ctc_greedy(batch, lengths, BLANK) == [
        ctc_greedy(t[None], torch.tensor([len(t)]), BLANK)[0] for t in (short, long)
    ]
    assert ctc_prefix_beam_search(batch[0], 3, BLANK, 4, 4) == ctc_prefix_beam_search(short, 3, BLANK, 4, 4)
    # read, the padding would change the output: the test above could fail
    assert ctc_greedy(batch, torch.tensor([5, 5]), BLANK)[0] != ctc_greedy(batch, lengths, BLANK)[0]
    assert ctc_prefix_beam_search(batch[0], 5, BLANK, 4, 4) != ctc_prefix_beam_search(short, 3, BLANK, 4, 4)


def test_no_frames_give_the_empty_labelling_surely():
    assert ctc_prefix_beam_search(table(0, 3, 4), 0, BLANK, 4, 4) == [([], 0.0)]
    assert ctc_greedy(table(0, 3, 4)[None], torch.tensor([0]), BLANK) == [[]]


# -- the CTC search -----------------------------------------------------------------------------------


class FixedCTC(nn.Module):
    """A CTC model whose log-probabilities are a fixed (B, T, V) table, whatever the source; a blank
    of id ``blank``."""

    def __init__(self, log_probs: Tensor, frames: Tensor, blank: int = BLANK) -> None:
        super().__init__()
        self.log_probs, self.frames, self.blank = log_probs, frames, blank

    def ctc_log_probs(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.log_probs[: len(src)].float(), self.frames[: len(src)]


def fixed_model() -> tuple[FixedCTC, list[Tensor]]:
    """Two sources: 4 frames and 3 frames (the rest padding) of 3 symbols; each row's valid table."""
    first, second = table(20, 4, 3), table(21, 4, 3)
    model = FixedCTC(torch.stack([first, second]), torch.tensor([4, 3]))
    return model, [first, second[:3]]


def test_the_ctc_search_decodes_greedily_unscored_and_checks_the_protocol():
    model, valid = fixed_model()
    assert isinstance(model, CTCModel)
    best_paths = [
        max(itertools.product(range(3), repeat=len(t)), key=lambda path: path_log_prob(t, path)) for t in valid
    ]
    assert CTC().decode(model, torch.zeros(2, 1)) == [[(list(labelling(path)), None)] for path in best_paths]


def test_the_ctc_search_gives_each_sources_n_best_with_their_log_probabilities():
    model, valid = fixed_model()
    outputs = CTC(width=31, nbest=3).decode(model, torch.zeros(2, 1))  # 31 = every labelling of at most 4 of 2 symbols
    assert len(outputs) == 2
    for found, rows in zip(outputs, valid):
        assert_same(found, ranked(exhaustive(rows))[:3])


def test_the_ctc_search_is_recorded_as_a_beam_without_length_penalty_and_refuses_oracle_lengths():
    model, _ = fixed_model()
    assert CTC(width=4, nbest=2).record() == {"beam": 4, "lenpen": None, "ctc": True}
    assert CTC().record() == {"beam": 1, "lenpen": None, "ctc": True}
    assert not CTC.scores_references and not CTC.incremental
    with pytest.raises(ValueError, match="oracle lengths are for left-to-right search"):
        CTC().decode(model, torch.zeros(2, 1), torch.tensor([2, 2]))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CTC(width=0), "--beam must be between 1 and 64 (got 0)"),
        (lambda: CTC(width=65), "--beam must be between 1 and 64 (got 65)"),
        (lambda: CTC(width=2, nbest=3), "--nbest must be between 1 and --beam (2)"),
        (lambda: CTC(nbest=2), "--nbest must be between 1 and --beam (1)"),
        (lambda: CTC(width=4, nbest=0), "--nbest must be between 1 and --beam (4)"),
        (lambda: CTC(batch_size=0), "--batch-size must be between 1 and 1024 (got 0)"),
    ],
)
def test_the_ctc_search_refuses_bad_settings_in_the_clis_one_line(build, message):
    with pytest.raises(UsageError) as refused:
        build()
    assert str(refused.value) == message
