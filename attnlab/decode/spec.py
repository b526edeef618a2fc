"""One typed search spec: how a batch of sources is decoded, as a small frozen dataclass per strategy.

- :class:`Greedy`: the argmax at every step;
- :class:`Beam`: beam search (width, GNMT length penalty, n-best lists);
- :class:`Sample`: temperature, top-k and top-p sampling from a seeded generator;
- :class:`Speculative`: a draft proposes ``k`` tokens a pass, the model keeps what it agrees with;
- :class:`MaskPredict`: a conditional masked language model's parallel decoding;
- :class:`CTC`: a CTC model's best path or prefix beam search (decode/ctc.py).

Each checks itself when built, with the one line the command line shows (the options are named as
the CLI spells them), and decodes with :meth:`Search.decode`: a new strategy is one more subclass
here, and :func:`~attnlab.decode.translate.translate`, ``evaluate`` and the commands take it
unchanged. What all share sits in :class:`Search`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from attnlab.data.tokenizers import EOS, PAD
from attnlab.decode.ctc import ctc_greedy, ctc_prefix_beam_search
from attnlab.decode.limits import MAX_BATCH, MAX_BEAM, MAX_NEW_TOKENS
from attnlab.decode.mask_predict import MAX_ITERATIONS, MaskPredictModel, mask_predict
from attnlab.decode.search import (
    Hypothesis,
    beam_search,
    filter_logits,
    greedy,
    until_eos,
)
from attnlab.decode.session import KV_CACHES, DecodingSession, length_limits
from attnlab.decode.speculative import Sampler, SpeculationStats, speculative_decode
from attnlab.errors import UsageError
from attnlab.nn.interfaces import CTCModel

NBest = list[list[tuple[list[int], float | None]]]  # each source's outputs as (ids, score), best first


def check_width(width: int, nbest: int) -> None:
    """A beam's ``width`` (--beam) and the ``nbest`` it returns, in the CLI's one line."""
    if not 1 <= width <= MAX_BEAM:
        raise UsageError(f"--beam must be between 1 and {MAX_BEAM} (got {width})")
    if not 1 <= nbest <= width:
        raise UsageError(f"--nbest must be between 1 and --beam ({width})")


@dataclass(frozen=True, kw_only=True)
class Search:
    """What every search shares: ``max_len``, the most tokens generated (None: each source's length
    + 50, within the model's positions), ``batch_size`` sources decoded together, and the cache
    (``use_cache``, ``kv_cache``: decode/session.py's KV_CACHES)."""

    max_len: int | None = None
    batch_size: int = 64
    use_cache: bool = True
    kv_cache: str = "auto"

    blank_score: ClassVar[float | None] = None  # the score of a blank line's blank output
    scores_references: ClassVar[bool] = True  # the model decoded so gives a left-to-right likelihood of a reference
    incremental: ClassVar[bool] = True  # a token at a time, over the KV cache that ``kv_cache`` names

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH:
            raise UsageError(f"--batch-size must be between 1 and {MAX_BATCH} (got {self.batch_size})")
        if (self.max_len or 0) < 0:
            raise UsageError("--max-len must be >= 0")
        if self.kv_cache not in KV_CACHES:
            raise UsageError(f"--kv-cache must be one of {', '.join(KV_CACHES)} (got {self.kv_cache!r})")

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        """(B, S) padded source ids -> each source's outputs. ``lengths``: (B,) each output's length
        exactly (oracle-length decoding), where the search decodes left to right."""
        raise NotImplementedError

    def record(self) -> dict[str, Any]:
        """The settings an evaluation's record names."""
        raise NotImplementedError

    def _no_lengths(self, lengths: Tensor | None) -> None:
        if lengths is not None:
            raise ValueError(f"oracle lengths are for left-to-right search (greedy or beam), not {type(self).__name__}")


@dataclass(frozen=True, kw_only=True)
class LeftToRight(Search):
    """A search that extends each output a token at a time, at least ``min_len`` tokens before EOS."""

    min_len: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_len < 0:
            raise UsageError("--min-len must be >= 0")
        if self.max_len is not None and self.min_len > self.max_len:
            raise UsageError(f"--min-len ({self.min_len}) must not exceed --max-len ({self.max_len})")

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        most, least = (self.max_len, self.min_len) if lengths is None else (lengths, lengths)
        return self.search(model, src, most, least)

    def search(self, model: nn.Module, src: Tensor, max_len: int | Tensor | None, min_len: int | Tensor) -> NBest:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Greedy(LeftToRight):
    """The argmax token at every step; outputs unscored (None)."""

    def search(self, model: nn.Module, src: Tensor, max_len: int | Tensor | None, min_len: int | Tensor) -> NBest:
        return [[(ids, None)] for ids in greedy(model, src, max_len, min_len, self.use_cache, self.kv_cache)]

    def record(self) -> dict[str, Any]:
        return {"beam": 1, "lenpen": None}  # no length penalty ranks a single hypothesis


@dataclass(frozen=True, kw_only=True)
class Beam(LeftToRight):
    """Beam search of ``width`` rows per source, ranked by log P / ((5 + |Y|) / 6)^``lenpen``; the
    ``nbest`` best of each, scored so."""

    width: int = 4
    lenpen: float = 0.6
    nbest: int = 1

    blank_score: ClassVar[float | None] = 0.0

    def __post_init__(self) -> None:
        check_width(self.width, self.nbest)
        super().__post_init__()

    def search(self, model: nn.Module, src: Tensor, max_len: int | Tensor | None, min_len: int | Tensor) -> NBest:
        return [[(h.tokens, h.normalized) for h in hyps] for hyps in self.hypotheses(model, src, max_len, min_len)]

    def hypotheses(
        self, model: nn.Module, src: Tensor, max_len: int | Tensor | None = None, min_len: int | Tensor | None = None
    ) -> list[list[Hypothesis]]:
        """Each source's n-best as :class:`~attnlab.decode.search.Hypothesis` (tokens, log P and the
        normalised score); the limits default to the search's own."""
        most = self.max_len if max_len is None else max_len
        least = self.min_len if min_len is None else min_len
        return beam_search(model, src, self.width, self.lenpen, self.nbest, most, least, self.use_cache, self.kv_cache)

    def record(self) -> dict[str, Any]:
        return {"beam": self.width, "lenpen": self.lenpen}


@dataclass(frozen=True, kw_only=True)
class Sample(Search):
    """A draw from the model's distribution at every step: the logits divided by ``temperature``,
    limited to the ``top_k`` likeliest tokens (None: all) and to the smallest set of probability
    >= ``top_p``, drawn with a generator seeded with ``seed``. ``max_len``: the tokens to draw."""

    max_len: int = 100  # a number of tokens to draw: no source to derive it from
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise UsageError(f"--temperature must be > 0 (got {self.temperature}); use --top-k 1 for greedy")
        if self.top_k is not None and self.top_k < 0:
            raise UsageError(f"--top-k must be at least 0, 0 for no limit (got {self.top_k})")
        if self.top_k == 0:  # Hugging Face's top_k=0: every token may be drawn
            object.__setattr__(self, "top_k", None)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.max_len <= MAX_NEW_TOKENS:
            raise UsageError(f"--max-new-tokens must be between 0 and {MAX_NEW_TOKENS:,} (got {self.max_len:,})")
        super().__post_init__()

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)

    def sampler(self, generator: torch.Generator) -> Sampler:
        """What draws each token in speculative sampling: these settings and ``generator``."""
        return Sampler(self.temperature, self.top_k, self.top_p, generator)

    def continue_prompt(self, model: nn.Module, prompt: Tensor) -> list[list[int]]:
        """(B, P) prompt ids (a decoder-only model) -> each row's drawn continuation."""
        return sample(model, self, prompt=prompt)

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        self._no_lengths(lengths)
        return [[(ids, None)] for ids in sample(model, self, src=src)]

    def record(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}


@torch.no_grad()
def sample(
    model: nn.Module, search: Sample, src: Tensor | None = None, prompt: Tensor | None = None
) -> list[list[int]]:
    """Draw a continuation for each row: of ``src`` (EncoderDecoder) or of ``prompt`` (DecoderLM), by
    ``search`` (:class:`Sample`: ``max_len`` new tokens, each drawn from the logits over ``temperature``, within ``top_k`` and ``top_p``, with a generator
    seeded with ``seed``; to EOS where ``stop_at_eos``). Returns the new token ids of each row
    (without the prompt, BOS or EOS).

    An encoder-decoder stops at the positions its decoder can encode. A decoder-only model with a
    position limit (learned positions, ``max_len``) goes on past it with a sliding context, as
    nanoGPT's sampler does: each further token is drawn given the last ``max_len`` tokens, which
    sit at positions 0 .. max_len - 1, so they are recomputed in one pass (no cache can carry over
    when every position shifts)."""
    max_new_tokens, generator = search.max_len, search.generator()
    session = DecodingSession(model, src=src, prompt=prompt, use_cache=search.use_cache, kv_cache=search.kv_cache)
    window = session.max_positions if not session.seq2seq else None  # the context slides past this
    if window is None:
        max_new_tokens = int(length_limits(session, None, max_new_tokens, feeds_last=False).max())
        session.reserve(max_new_tokens - 1)  # the last token is not fed back
    else:  # this session serves until the context fills the window
        assert prompt is not None  # a decoder-only model (no window otherwise) continues a prompt
        session.reserve(min(max_new_tokens - 1, window - prompt.shape[1]))
    tokens = session.start
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    out: list[Tensor] = []
    for _ in range(max_new_tokens):
        # prompt is not None: always, with a window (asserted above)
        if window is not None and prompt is not None and prompt.shape[1] + len(out) > window:  # no position left: slide
            context = torch.cat([prompt, *(t[:, None] for t in out[-window:])], dim=1)[:, -window:]  # the last tokens
            # one pass over the window; a cache would be filled and never read
            session = DecodingSession(model, prompt=context, use_cache=False)
            tokens = session.start
        logits = filter_logits(session.step(tokens), search.temperature, search.top_k, search.top_p)
        probs = logits.softmax(-1)
        next_token = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(tokens.device)
        next_token = next_token.masked_fill(finished, PAD)
        out.append(next_token)
        if search.stop_at_eos:
            finished |= next_token == EOS
            if finished.all():
                break
        tokens = next_token[:, None]
    rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(tokens.shape[0])]
    return [until_eos(row) if search.stop_at_eos else row for row in rows]


@dataclass(frozen=True, kw_only=True)
class Speculative(Search):
    """Speculative decoding, one source at a time: ``draft`` (a smaller model with the same
    vocabulary, or None for the model's own multi-token heads) proposes ``k`` tokens a pass, the
    model keeps the longest prefix it agrees with. Greedy's output (``sampling`` None) or a draw
    from the model's distribution (``sampling``). What speculation did adds up in ``stats``."""

    draft: nn.Module | None = None
    k: int = 4
    sampling: Sample | None = None
    stats: SpeculationStats = field(default_factory=SpeculationStats, compare=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UsageError(f"--speculate must be at least 1 (got {self.k})")
        super().__post_init__()

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        self._no_lengths(lengths)
        return [[(self.one(model, src=row[None, row != PAD]), None)] for row in src]

    def continue_prompt(self, model: nn.Module, prompt: Tensor) -> list[list[int]]:
        """(B, P) prompt ids -> each row's continuation (one generator for them all, as :class:`Sample`)."""
        sampler = self.sampling.sampler(self.sampling.generator()) if self.sampling is not None else None
        return [self.one(model, prompt=row[None], sampler=sampler) for row in prompt]

    def one(
        self, model: nn.Module, src: Tensor | None = None, prompt: Tensor | None = None, sampler: Sampler | None = None
    ) -> list[int]:
        """The continuation of one (1, S) source or (1, P) prompt; its statistics added to ``stats``."""
        stop_at_eos = self.sampling.stop_at_eos if self.sampling is not None else True
        ids, stats = speculative_decode(
            model,
            self.draft,
            src=src,
            prompt=prompt,
            k=self.k,
            max_new_tokens=self.max_len,
            sampler=sampler,
            stop_at_eos=stop_at_eos,
        )
        self.stats.add(stats)
        return ids

    def record(self) -> dict[str, Any]:
        return {"beam": 1, "lenpen": None, "speculate": self.k}


@dataclass(frozen=True, kw_only=True)
class MaskPredict(Search):
    """Mask-predict (decode/mask_predict.py): ``iterations`` T passes (the paper's 10) over each of
    the ``length_beam`` L likeliest lengths (its 5); outputs scored by their mean log-probability.
    Such a model gives no left-to-right likelihood of a reference."""

    iterations: int = 10
    length_beam: int = 5

    scores_references: ClassVar[bool] = False
    incremental: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not 1 <= self.iterations <= MAX_ITERATIONS:
            raise UsageError(f"--iterations must be between 1 and {MAX_ITERATIONS} (got {self.iterations})")
        if not 1 <= self.length_beam <= MAX_BEAM:
            raise UsageError(f"--length-beam must be between 1 and {MAX_BEAM} (got {self.length_beam})")
        super().__post_init__()

    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        self._no_lengths(lengths)
        cmlm = cast(MaskPredictModel, model)  # the conditional masked LM this search decodes with
        return [[(ids, score)] for ids, score in mask_predict(cmlm, src, self.iterations, self.length_beam)]

    def record(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "length_beam": self.length_beam}


@dataclass(frozen=True, kw_only=True)
class CTC(Search):
    """CTC decoding (decode/ctc.py) of a :class:`~attnlab.nn.interfaces.CTCModel`: ``width`` 1, each
    source's best path, unscored (None) as greedy's; wider, the prefix beam search of ``width``
    prefixes a frame, whose ``nbest`` best are scored by their log-probability. An output is as long
    as the model's frames allow: ``max_len`` and the cache settings are not read."""

    width: int = 1
    nbest: int = 1

    scores_references: ClassVar[bool] = False  # a CTC model gives no left-to-right likelihood
    incremental: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_width(self.width, self.nbest)
        super().__post_init__()

    @torch.no_grad()
    def decode(self, model: nn.Module, src: Tensor, lengths: Tensor | None = None) -> NBest:
        self._no_lengths(lengths)
        ctc = cast(CTCModel, model)  # the model whose frames this search reads
        log_probs, frames = ctc.ctc_log_probs(src)  # (B, T, V), (B,)
        if self.width == 1:
            return [[(ids, None)] for ids in ctc_greedy(log_probs, frames, ctc.blank)]
        rows = zip(log_probs.cpu(), frames.tolist())
        outputs = [ctc_prefix_beam_search(row, n, ctc.blank, self.width, self.nbest) for row, n in rows]
        return [[(ids, score) for ids, score in nbest] for nbest in outputs]

    def record(self) -> dict[str, Any]:
        return {"beam": self.width, "lenpen": None, "ctc": True}  # no length penalty: log P ranks the prefixes
