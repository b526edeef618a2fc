"""decode/spec.py: each search checks itself in one line (the CLI's), decodes as the search function
it names, and a new strategy is one subclass that translate takes unchanged."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass

import pytest
import torch
from torch import Tensor, nn

from attnlab.decode.search import beam_search, greedy
from attnlab.decode.spec import (
    Beam,
    Greedy,
    MaskPredict,
    NBest,
    Sample,
    Search,
    Speculative,
)
from attnlab.decode.speculative import speculative_decode
from attnlab.decode.translate import translate
from attnlab.errors import UsageError

from helpers import eos_biased, random_ids, tiny_model


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Beam(width=0), "--beam must be between 1 and 64 (got 0)"),
        (lambda: Beam(width=65), "--beam must be between 1 and 64 (got 65)"),
        (lambda: Beam(width=2, nbest=3), "--nbest must be between 1 and --beam (2)"),
        (lambda: Greedy(batch_size=0), "--batch-size must be between 1 and 1024 (got 0)"),
        (lambda: Beam(batch_size=1025), "--batch-size must be between 1 and 1024 (got 1025)"),
        (lambda: Greedy(max_len=-1), "--max-len must be >= 0"),
        (lambda: Greedy(min_len=-1), "--min-len must be >= 0"),
        (lambda: Beam(max_len=3, min_len=4), "--min-len (4) must not exceed --max-len (3)"),
        (
            lambda: Greedy(kv_cache="paged"),
            "--kv-cache must be one of auto, dynamic, static, graph, compiled (got 'paged')",
        ),
        (lambda: Sample(temperature=0.0), "--temperature must be > 0 (got 0.0); use --top-k 1 for greedy"),
        (lambda: Sample(top_k=-1), "--top-k must be at least 0, 0 for no limit (got -1)"),
        (lambda: Sample(top_p=1.5), "--top-p must be in (0, 1] (got 1.5)"),
        (lambda: Sample(max_len=100_001), "--max-new-tokens must be between 0 and 100,000 (got 100,001)"),
        (lambda: Speculative(k=0), "--speculate must be at least 1 (got 0)"),
        (lambda: MaskPredict(iterations=0), "--iterations must be between 1 and 1000 (got 0)"),
        (lambda: MaskPredict(length_beam=65), "--length-beam must be between 1 and 64 (got 65)"),
    ],
)
def test_each_search_refuses_bad_settings_in_the_clis_one_line(build, message):
    with pytest.raises(UsageError) as refused:
        build()
    assert str(refused.value) == message


def test_a_search_is_frozen_keyword_only_and_top_k_zero_means_no_limit():
    with pytest.raises(FrozenInstanceError):
        Beam().width = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Beam(3)  # type: ignore[misc]
    assert Sample(top_k=0).top_k is None and Sample(top_k=5).top_k == 5


def test_each_search_decodes_as_the_function_it_names():
    model = eos_biased(tiny_model(), 2.0)
    src = random_ids(3, 7, generator_seed=1)
    assert Greedy(max_len=9, min_len=2).decode(model, src) == [[(ids, None)] for ids in greedy(model, src, 9, 2)]
    beams = beam_search(model, src, 3, 1.0, 2, 9, 2)
    assert Beam(width=3, lenpen=1.0, nbest=2, max_len=9, min_len=2).decode(model, src) == [
        [(h.tokens, h.normalized) for h in hyps] for hyps in beams
    ]
    drawn = Sample(max_len=6, temperature=0.7, top_k=5, seed=4).decode(model, src)
    assert (
        drawn
        == Sample(max_len=6, temperature=0.7, top_k=5, seed=4).decode(model, src)
        != Sample(max_len=6, temperature=0.7, top_k=5, seed=5).decode(model, src)
    )  # seeded
    assert Sample(max_len=6, top_k=1, seed=4).decode(model, src) == [[(ids, None)] for ids in greedy(model, src, 6)]
    speculating = Speculative(draft=model, k=3, max_len=9)
    one_by_one = [speculative_decode(model, model, src=row[None], k=3, max_new_tokens=9)[0] for row in src]
    assert speculating.decode(model, src) == [[(ids, None)] for ids in one_by_one]
    assert speculating.stats.accepted == speculating.stats.proposed > 0  # the model drafting for itself


def test_oracle_lengths_set_both_limits_of_a_left_to_right_search_and_are_refused_by_the_others():
    model = eos_biased(tiny_model(), 2.0)
    src = random_ids(2, 5, generator_seed=2)
    lengths = torch.tensor([3, 6])
    assert [len(out[0][0]) for out in Greedy().decode(model, src, lengths)] == [3, 6]
    assert [len(out[0][0]) for out in Beam(width=2).decode(model, src, lengths)] == [3, 6]
    with pytest.raises(ValueError, match="oracle lengths are for left-to-right search"):
        Speculative(draft=model).decode(model, src, lengths)


@dataclass(frozen=True, kw_only=True)
class EchoSource(Search):
    """A strategy of the test's own (as CTC's will be one of the audio issue's): the source, unchanged."""

    score: float = -1.0

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        return [[(row[row != 0][:-1].tolist(), self.score)] for row in src]  # its tokens less EOS

    def record(self) -> dict[str, float]:
        return {"score": self.score}


def test_a_new_strategy_is_one_subclass_that_translate_takes_unchanged():
    from attnlab.data.tokenizers import Tokenizer

    tokenizer = Tokenizer.train("word", ["a b c d", "b c"], 20)
    lines = ["a b c", "", "d a"]
    out = translate(tiny_model(), {"src": tokenizer, "tgt": tokenizer}, lines, EchoSource(batch_size=1))
    assert out == [[("a b c", -1.0)], [("", None)], [("d a", -1.0)]]
