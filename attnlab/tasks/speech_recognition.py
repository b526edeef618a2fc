"""Speech recognition: a recording of spoken digits to its transcript (``data.task: speech_recognition``).

The examples are strings of digits made from recordings of single digits (data/spoken_strings.py) in
FSDD's layout (tasks/recordings.py: ``data.recordings``, and its validation split by index or speaker):
each string joins ``strings.min_digits`` .. ``strings.max_digits`` recordings of one split, with
silences of 0 .. ``strings.max_gap_ms`` ms between them and, with ``strings.snr_db``, white noise. Its
transcript is the digits as words ("3 5 1"), word-tokenised. Training strings are drawn afresh for
every batch from (train.seed, epoch, batch) alone, so a resumed run goes on exactly, ``splits.n_train``
of them an epoch; a split that is scored (validation, or ``evaluate --split``) is ``splits.n_valid``
strings drawn once from that split's recordings and ``splits.seed`` alone (the same for every training
seed), and a folder of recordings given to `attnlab evaluate --data DIR` (or ``--test-set fsdd:test``)
is read by the same rule.

A batch is the zero-padded waveforms (B, S) as the source and the transcripts as a translation's
target, learnt by an encoder-decoder (models/whisper.py) or an encoder read by CTC (models/whisper_ctc.py),
as tasks/transcribers.py says (the model computes its own features). Validation adds the exact match and
word error rate of ``train.eval_exact_match`` greedy transcripts; `attnlab evaluate` gives the word and character
error rates (jiwer), exact match and the references' perplexity by greedy or beam search;
`attnlab transcribe RUN a.wav` decodes files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Optional, cast

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import TypedConfig, at_least, flattened
from attnlab.data.audio import read_audio, zero_padded
from attnlab.data.batching import Batch, pad_sequences
from attnlab.data.spoken_strings import Recorded, SpokenString
from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.decode.spec import Greedy, NBest, Search
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.eval.metrics import error_rates, exact_match
from attnlab.models.audio import WAVEFORMS
from attnlab.models.shape import DataShape
from attnlab.tasks.abilities import DecodesBySearch, RunState
from attnlab.tasks.batching import Batching, SeededBatches, Tokenizers
from attnlab.tasks.parts import Splits, Text
from attnlab.tasks.recordings import Notes, Recording, Recordings, recordings_in
from attnlab.tasks.task import Amp, Task, TaskConfig, register_task
from attnlab.tasks.transcribers import transcriber_of

SCORED = 1  # the salt of a scored split's strings, beside the training batches' (seed, epoch, batch)


@dataclass(frozen=True)
class DigitStrings(TypedConfig):
    """How the strings are made (``data.strings``): ``min_digits`` .. ``max_digits`` recordings each,
    silences of 0 .. ``max_gap_ms`` whole milliseconds between them, white noise ``snr_db`` dB below the
    string's power (None: none), and at most ``longest_seconds`` long (a longer draw is drawn again)."""

    section: ClassVar[str] = "data.strings"

    min_digits: int = 2
    max_digits: int = 7
    max_gap_ms: int = 300
    snr_db: Optional[float] = None
    longest_seconds: float = 8.0

    def check(self) -> None:
        at_least("strings.min_digits", self.min_digits, 1)
        at_least("strings.max_digits", self.max_digits, self.min_digits)
        at_least("strings.max_gap_ms", self.max_gap_ms, 0)
        if self.longest_seconds <= 0:  # (a number that is not finite: refused as it is read)
            raise ConfigError(
                f"strings.longest_seconds must be a positive number of seconds (got {self.longest_seconds})"
            )


@dataclass(frozen=True)
class SpeechRecognitionConfig(TaskConfig):
    """The recordings (tasks/recordings.py), how they make strings (``strings``), and how many strings
    an epoch has and each scored split (``splits``: seed, n_train, n_valid)."""

    source: Recordings = flattened(Recordings())
    strings: DigitStrings = DigitStrings()
    splits: Splits = Splits(seed=0, n_train=8000, n_valid=1000)

    splits_read: ClassVar[tuple[str, ...]] = ("seed", "n_train", "n_valid")

    def check(self) -> None:
        self.splits.read_by("speech_recognition", self.splits_read)
        self.splits.given(*self.splits_read)

    def check_trainable(self) -> None:
        self.source.folder("speech_recognition")

    @property
    def samples(self) -> int:
        """The longest string, in samples."""
        return round(self.strings.longest_seconds * self.source.sample_rate)

    @property
    def longest_sequence(self) -> int:
        """BOS and the digits of the longest string: what the decoder reads in training."""
        return self.strings.max_digits + 1


# -- strings and their batches ------------------------------------------------------------------------


def recorded(recordings: list[Recording], rate: int, note: Notes) -> Recorded:
    """The recordings' sounds at ``rate``, each of its digit."""
    return Recorded([read_audio(r.path, rate, note).samples for r in recordings], [r.digit for r in recordings], rate)


def string_batch(strings: list[SpokenString], split: Recorded, snr_db: float | None, tokenizer: Tokenizer) -> Batch:
    """src: (B, S) the strings' waveforms, zero-padded; tgt_in: (B, T) BOS + digits; tgt_out: digits + EOS."""
    src = zero_padded([split.waveform(s, snr_db) for s in strings])
    ids = tokenizer.encode_batch([split.transcript(s) for s in strings])
    return Batch(
        src=src, tgt_in=pad_sequences([[BOS] + r for r in ids]), tgt_out=pad_sequences([r + [EOS] for r in ids])
    )


@dataclass(kw_only=True)
class SpeechData:
    """Each split's recordings (``splits``) from the folder ``origin``, the tokenizers ({'src': None,
    'tgt': the digits'}), the config, the seed of the training batches (train.seed), and the strings of
    each scored split, drawn once."""

    splits: dict[str, Recorded]
    origin: str
    tokenizers: Tokenizers
    cfg: SpeechRecognitionConfig
    batch_size: int
    seed: int
    _scored: dict[str, list[SpokenString]] = field(default_factory=dict, repr=False)
    _eval: dict[str, list[Batch]] = field(default_factory=dict, repr=False)

    def draw(self, rng: np.random.Generator, split: str, n: int) -> list[SpokenString]:
        strings = self.cfg.strings
        limits = (strings.min_digits, strings.max_digits)
        where = f"{self.origin} ({split} recordings)"
        return [self.splits[split].draw(rng, limits, strings.max_gap_ms, self.cfg.samples, where) for _ in range(n)]

    def batch(self, strings: list[SpokenString], split: str) -> Batch:
        tokenizer = cast(Tokenizer, self.tokenizers["tgt"])  # the task's own role: never None
        return string_batch(strings, self.splits[split], self.cfg.strings.snr_db, tokenizer)

    def scored(self, split: str) -> list[SpokenString]:
        """The split's ``n_valid`` strings, drawn from (splits.seed, the split's name) alone."""
        if split not in self._scored:
            salt = list(split.encode())
            rng = np.random.default_rng([cast(int, self.cfg.splits.seed), SCORED, *salt])  # given: check
            self._scored[split] = self.draw(rng, split, cast(int, self.cfg.splits.n_valid))  # given: check
        return self._scored[split]

    def transcripts(self, split: str) -> list[str]:
        return [self.splits[split].transcript(s) for s in self.scored(split)]

    def epoch_batches(self, epoch: int) -> SeededBatches[Batch]:
        """ceil(n_train / batch_size) batches, batch k's strings drawn from (seed, epoch, k) alone."""
        n = -(-cast(int, self.cfg.splits.n_train) // self.batch_size)  # given: check

        def drawn(seed: int) -> Batch:
            return self.batch(self.draw(np.random.default_rng(seed), "train", self.batch_size), "train")

        return SeededBatches(n, self.seed, epoch, drawn)

    def eval_batches(self, split: str) -> list[Batch]:
        if split not in self._eval:
            strings = self.scored(split)
            self._eval[split] = [
                self.batch(strings[i : i + self.batch_size], split) for i in range(0, len(strings), self.batch_size)
            ]
        return self._eval[split]


# -- decoding and scoring -------------------------------------------------------------------------------


@torch.no_grad()
def transcribed(model: nn.Module, batches: list[Tensor], search: Search) -> list[NBest]:
    """Each (B, S) batch of zero-padded waveforms -> each clip's transcripts by ``search`` (ids, score): CTC's
    counterpart of it for a model read by CTC."""
    model.eval()
    device = next(model.parameters()).device
    search = transcriber_of(model).search(search)
    return [search.decode(model, waves.to(device)) for waves in batches]


def transcript_record(model: nn.Module, data: SpeechData, split: str, search: Search) -> dict[str, Any]:
    """WER and CER (jiwer), exact match and the references' perplexity of the split's scored strings."""
    tokenizer = cast(Tokenizer, data.tokenizers["tgt"])  # the task's own role: never None
    transcriber, batches = transcriber_of(model), data.eval_batches(split)
    search = transcriber.search(search)
    outputs = transcribed(model, [cast(Tensor, b.src) for b in batches], search)
    hypotheses = [tokenizer.decode(nbest[0][0]) for chunk in outputs for nbest in chunk]
    references = data.transcripts(split)
    likelihood = transcriber.likelihood(model, batches)
    return {
        **error_rates(hypotheses, references),
        "exact_match": exact_match(hypotheses, references),
        "ppl": likelihood["ppl"],
        "nll": likelihood["loss"],
        "strings": len(references),
        **search.record(),
        "examples": [{"reference": r, "transcript": h} for r, h in list(zip(references, hypotheses))[:5]],
    }


@register_task
class SpeechRecognition(DecodesBySearch, Task[SpeechData, Batch]):
    """A transcript written for each recording (data.task: speech_recognition), scored by loss,
    perplexity and word error rate."""

    name = "speech_recognition"
    config = SpeechRecognitionConfig
    needs = {"inputs": WAVEFORMS, "encoder": True}  # with a decoder (whisper), or read by CTC (whisper_ctc)
    metrics = {"valid_loss": True, "valid_ppl": True, "exact_match": False, "wer": True}
    commands = ("transcribe", "evaluate", "inspect")
    tokenizers = ("tgt",)
    cfg: SpeechRecognitionConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> SpeechData:
        cfg = self.cfg
        kept, held = cfg.source.split(self.name)
        note = Notes()
        splits = {
            "train": recorded(kept, cfg.source.sample_rate, note),
            "valid": recorded(held, cfg.source.sample_rate, note),
        }
        note.close()
        if tokenizers is None:
            tokenizers = {"src": None, "tgt": Text(tokenizer="word").fitted(sorted(set(splits["train"].words)))}
        return SpeechData(
            splits=splits,
            origin=cast(str, cfg.source.recordings),  # given: split read it
            tokenizers=tokenizers,
            cfg=cfg,
            batch_size=batching.batch_size,
            seed=batching.seed,
        )

    def data_shape(self, data: SpeechData | None = None) -> DataShape:
        """The rate and the longest string are the config's; the vocabulary the digits' tokenizer's."""
        return DataShape(
            sample_rate=self.cfg.source.sample_rate,
            samples=self.cfg.samples,
            vocab_size=self.vocabulary(data, "tgt"),
            pad_id=PAD,
        )

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        return transcriber_of(model).loss(model, batch, label_smoothing, amp)

    def validate(
        self, model: nn.Module, data: SpeechData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        """Loss and perplexity, and the exact match and word error rate of ``n_decoded`` greedy transcripts."""
        scores = transcriber_of(model).likelihood(model, data.eval_batches(split))
        result = {"valid_loss": scores["loss"], "valid_ppl": scores["ppl"]}
        if n_decoded:
            tokenizer = cast(Tokenizer, data.tokenizers["tgt"])  # the task's own role: never None
            batches = [cast(Tensor, b.src) for b in data.eval_batches(split)][: -(-n_decoded // data.batch_size)]
            outputs = transcribed(model, batches, Greedy(max_len=self.cfg.strings.max_digits + 1))
            hypotheses = [tokenizer.decode(nbest[0][0]) for chunk in outputs for nbest in chunk][:n_decoded]
            references = data.transcripts(split)[:n_decoded]
            result["exact_match"] = exact_match(hypotheses, references)
            result["wer"] = error_rates(hypotheses, references)["wer"]
        return result

    def analysis_pass(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        return transcriber_of(model).analysed(model, batch)

    def evaluate_split(self, model: nn.Module, data: SpeechData, split: str) -> dict[str, Any]:
        """Transcripts of a split's scored strings by the task's search, scored."""
        return transcript_record(model, data, split, replace(self.search, max_len=self.cfg.strings.max_digits + 1))

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """Transcripts of ``n_valid`` strings made from a folder of recordings (every one of them, named
        as the training ones) by the same rule, scored."""
        self.refuse_split(split)
        note = Notes()
        folder = recorded(recordings_in(path), self.cfg.source.sample_rate, note)
        note.close()
        data = SpeechData(
            splits={"test": folder},
            origin=path,
            tokenizers=tokenizers,
            cfg=self.cfg,
            batch_size=64,
            seed=0,  # no training batches: its strings are the scored ones
        )
        return transcript_record(model, data, "test", replace(self.search, max_len=self.cfg.strings.max_digits + 1))

    def transcribe(
        self, model: nn.Module, run: RunState, paths: list[str], search: Search
    ) -> list[list[tuple[str, float | None]]]:
        """Each audio file's transcripts (best first) by ``search``, read at the run's rate; a file longer than
        the strings the model was trained on is refused."""
        if not paths:
            raise UsageError(
                "give the recordings to transcribe as arguments: attnlab transcribe RUN a.wav [more.wav ...]"
            )
        tokenizer = cast(Tokenizer, run.read_tokenizers()["tgt"])  # the task's own role: never None
        note = Notes()
        sounds = [read_audio(p, self.cfg.source.sample_rate, note).samples for p in paths]
        note.close()
        for path, sound in zip(paths, sounds):
            if len(sound) > self.cfg.samples:  # its frames past the limit would go unread
                raise DataError(
                    f"{path}: {len(sound) / self.cfg.source.sample_rate:.2f} s, longer than the "
                    f"{self.cfg.strings.longest_seconds:g} s the model reads (data.strings.longest_seconds)"
                )
        batches = [zero_padded(sounds[i : i + search.batch_size]) for i in range(0, len(sounds), search.batch_size)]
        outputs = transcribed(model, batches, search)
        return [[(tokenizer.decode(ids), score) for ids, score in nbest] for chunk in outputs for nbest in chunk]

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        search = "greedy" if result["beam"] == 1 else f"beam {result['beam']}, lenpen {result['lenpen']}"
        if result.get("ctc"):
            search = "CTC best path" if result["beam"] == 1 else f"CTC prefix beam {result['beam']}"
        lines = [
            f"WER  {result['wer']:.2%}   CER  {result['cer']:.2%}   exact match  {result['exact_match']:.2%}   "
            f"perplexity of the references  {result['ppl']:.3f}   ({result['strings']:,} strings, {source}, {search})"
        ]
        return lines + [f"  {e['transcript']}   (reference: {e['reference']})" for e in result["examples"]]

    def describe(self, data: SpeechData) -> str:
        sizes = ", ".join(f"{name} {len(split.sounds):,}" for name, split in data.splits.items())
        strings = self.cfg.strings
        noise = "no noise" if strings.snr_db is None else f"noise at {strings.snr_db:g} dB SNR"
        return (
            f"recordings: {sizes}; strings of {strings.min_digits}-{strings.max_digits} digits, gaps of 0-"
            f"{strings.max_gap_ms} ms, {noise}; {self.cfg.splits.n_train:,} training strings an epoch, "
            f"{self.cfg.splits.n_valid:,} validation strings"
        )
