"""Audio classification: a recording to one of a set of classes (``data.task: audio_classification``).

The data is a folder of recordings named as the Free Spoken Digit Dataset's, ``{digit}_{speaker}_{index}.wav``
(`attnlab data get fsdd` writes its training recordings to data/fsdd/train/); ``label`` chooses what is
learnt: the ``digit`` spoken or the ``speaker``. Validation: the recordings whose index is
``valid_first`` .. ``valid_last`` (5-9 by default: FSDD's official test recordings, 0-4, are never in
the training folder), so the split depends on the names alone; or, with ``valid_speaker``, every
recording of that speaker, the others' being the training split (the speaker-held-out protocol: one
fold of six on FSDD, recipes/audio/speaker_folds_sweep.yaml runs them all). Each recording is read by
data/audio.py (soundfile), mixed to mono and resampled to ``sample_rate`` (soxr), then cut to
``clip_seconds`` or zero-padded to it; a batch is the waveforms (B, S) and their lengths (B,) in samples
(models/audio.py's kind ``waveforms``): the model computes its own features.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, cast

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import at_least, one_of
from attnlab.data.audio import audio_files, read_audio
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.audio import WAVEFORMS
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import Classifier
from attnlab.tasks.abilities import Prediction, PredictsLabels, RunState
from attnlab.tasks.batching import Batching, Tokenizers, batch_seed
from attnlab.tasks.classifier_task import ClassifierTask, ExampleBatch, evaluation_report
from attnlab.tasks.image_classification import class_ids, class_names
from attnlab.tasks.task import TaskConfig, register_task

NAME = re.compile(r"^(?P<digit>\d+)_(?P<speaker>[^_]+)_(?P<index>\d+)$")  # FSDD: 7_jackson_32.wav
LABELS = ("digit", "speaker")


@dataclass(frozen=True)
class AudioClassificationConfig(TaskConfig):
    """``recordings``: a folder of ``{digit}_{speaker}_{index}`` audio files; ``label``: digit or speaker;
    the recordings of index ``valid_first`` .. ``valid_last`` are the validation split, or, with
    ``valid_speaker``, every recording of that speaker; every clip resampled to ``sample_rate`` Hz and
    cut or zero-padded to ``clip_seconds``."""

    recordings: Optional[str] = None
    label: str = "digit"
    valid_first: int = 5
    valid_last: int = 9
    valid_speaker: Optional[str] = None
    sample_rate: int = 8000
    clip_seconds: float = 1.0

    def check(self) -> None:
        one_of("label", self.label, LABELS)
        at_least("valid_first", self.valid_first, 0)
        at_least("valid_last", self.valid_last, self.valid_first)
        at_least("sample_rate", self.sample_rate, 1)
        if not (math.isfinite(self.clip_seconds) and self.clip_seconds > 0):
            raise ConfigError(f"clip_seconds must be a positive number of seconds (got {self.clip_seconds})")
        if self.samples < 1:
            raise ConfigError(f"clip_seconds ({self.clip_seconds}) is less than one sample at {self.sample_rate} Hz")
        if self.valid_speaker is not None and self.label == "speaker":
            raise ConfigError(
                f"valid_speaker ('{self.valid_speaker}') holds a speaker out, so label 'speaker' would be scored on "
                f"a class it never trained: hold out by index (valid_first, valid_last) or learn the digit"
            )
        by_index = (self.valid_first, self.valid_last) != (type(self).valid_first, type(self).valid_last)
        if self.valid_speaker is not None and by_index:  # an index range other than the default's
            raise ConfigError(
                f"valid_speaker ('{self.valid_speaker}') makes the validation split that speaker's recordings: "
                f"valid_first and valid_last choose by index instead; give one or the other"
            )

    def in_validation(self, recording: Recording) -> bool:
        """Whether ``recording`` is in the validation split (its speaker, or its index)."""
        if self.valid_speaker is not None:
            return recording.speaker == self.valid_speaker
        return self.valid_first <= recording.index <= self.valid_last

    def held_out(self) -> str:
        """The rule of the validation split, as the errors name it."""
        if self.valid_speaker is not None:
            return f"speaker '{self.valid_speaker}'"
        return f"indices {self.valid_first}-{self.valid_last}"

    def check_trainable(self) -> None:
        if self.recordings is None:
            raise ConfigError(
                "data.task 'audio_classification' needs 'recordings' (a folder of "
                "{digit}_{speaker}_{index}.wav files, e.g. data/fsdd/train)"
            )

    @property
    def samples(self) -> int:
        """The clips' length in samples."""
        return round(self.clip_seconds * self.sample_rate)


# -- reading -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recording:
    path: Path
    digit: str
    speaker: str
    index: int

    def label(self, field_name: str) -> str:
        return self.digit if field_name == "digit" else self.speaker


def recordings_in(folder: str | Path) -> list[Recording]:
    """The folder's audio files, each named ``{digit}_{speaker}_{index}``; another name is refused, naming it."""
    found = []
    for path in audio_files(folder):
        match = NAME.match(path.stem)
        if match is None:
            raise DataError(
                f"{path}: not named {{digit}}_{{speaker}}_{{index}} (as FSDD's 7_jackson_32.wav), so "
                f"its label is unknown"
            )
        found.append(Recording(path, str(int(match["digit"])), match["speaker"], int(match["index"])))
    return found


@dataclass
class Clips:
    """Waveforms (N, S) float32, zero-padded; their lengths (N,) in samples; (N,) True where a file was
    longer and cut."""

    waveforms: np.ndarray
    lengths: np.ndarray
    cut: np.ndarray


def read_clips(paths: list[Path], rate: int, samples: int, note: Callable[[str], None]) -> Clips:
    """Each file at ``rate`` Hz, cut or zero-padded to ``samples``."""
    waveforms = np.zeros((len(paths), samples), dtype=np.float32)
    lengths = np.zeros(len(paths), dtype=np.int64)
    cut = np.zeros(len(paths), dtype=bool)
    for row, path in enumerate(paths):
        sound = read_audio(path, rate, note).samples
        cut[row] = len(sound) > samples
        lengths[row] = min(len(sound), samples)
        waveforms[row, : lengths[row]] = sound[:samples]
    return Clips(waveforms, lengths, cut)


class Notes:
    """read_audio's one-line notes, the first said and the rest counted (a resampled folder)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, line: str) -> None:
        if self.count == 0:
            print(f"note: {line}", file=sys.stderr)
        self.count += 1

    def close(self) -> None:
        if self.count > 1:
            print(f"note: and {self.count - 1:,} more such notes", file=sys.stderr)


# -- batches --------------------------------------------------------------------------------------------


@dataclass
class AudioBatch(ExampleBatch):
    """waveforms: (B, S) zero-padded; lengths: (B,) samples; labels: (B,) class ids."""

    waveforms: Tensor
    lengths: Tensor
    labels: Tensor

    def logits(self, model: nn.Module) -> Tensor:
        """(B, n_classes)."""
        return cast(Classifier, model).classify(self.waveforms, self.lengths)  # the task's model: a classifier


def batches_of(waveforms: Tensor, lengths: Tensor, labels: Tensor, size: int) -> list[AudioBatch]:
    return [
        AudioBatch(waveforms[rows], lengths[rows], labels[rows])
        for rows in torch.split(torch.arange(len(labels)), size)
    ]


@dataclass(kw_only=True)
class AudioData:
    """Per split, waveforms (N, S), lengths (N,) and class ids (N,); the class names; an epoch's
    order drawn from (seed, epoch) alone, so a resumed run goes on exactly."""

    splits: dict[str, tuple[Tensor, Tensor, Tensor]]
    labels: list[str]
    batch_size: int
    seed: int = 0
    cut: int = 0
    _eval: dict[str, list[AudioBatch]] = field(default_factory=dict, repr=False)

    def epoch_batches(self, epoch: int) -> list[AudioBatch]:
        train = self.splits["train"]
        order = torch.randperm(len(train[2]), generator=torch.Generator().manual_seed(batch_seed(self.seed, epoch, 0)))
        # waveforms, lengths and labels, in the epoch's order (a generator of three)
        return batches_of(*cast("tuple[Tensor, Tensor, Tensor]", (t[order] for t in train)), self.batch_size)

    def eval_batches(self, split: str) -> list[AudioBatch]:
        if split not in self._eval:
            self._eval[split] = batches_of(*self.splits[split], self.batch_size)
        return self._eval[split]


def tensors(
    recordings: list[Recording],
    cfg: AudioClassificationConfig,
    classes: list[str],
    where: str,
    note: Callable[[str], None],
) -> tuple[tuple[Tensor, Tensor, Tensor], int]:
    clips = read_clips([r.path for r in recordings], cfg.sample_rate, cfg.samples, note)
    ids = class_ids([r.label(cfg.label) for r in recordings], classes, where)
    return (torch.from_numpy(clips.waveforms), torch.from_numpy(clips.lengths), ids), int(clips.cut.sum())


@register_task
class AudioClassification(PredictsLabels, ClassifierTask[AudioData, AudioBatch]):
    """A label for each recording (data.task: audio_classification), scored by loss, accuracy and macro-F1."""

    name = "audio_classification"
    config = AudioClassificationConfig
    needs = {"inputs": WAVEFORMS}
    commands = ("predict", "evaluate")
    cfg: AudioClassificationConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> AudioData:
        cfg = self.cfg
        cfg.check_trainable()
        found = recordings_in(cast(str, cfg.recordings))  # given: check_trainable
        held = [r for r in found if cfg.in_validation(r)]
        kept = [r for r in found if not cfg.in_validation(r)]
        for split, rows in (("training", kept), ("validation", held)):
            if not rows:
                speakers = (
                    f"; its speakers: {', '.join(sorted({r.speaker for r in found}))}" if cfg.valid_speaker else ""
                )
                raise DataError(f"{cfg.recordings}: no {split} recordings (validation: {cfg.held_out()}){speakers}")
        classes = state["labels"] if state else class_names([r.label(cfg.label) for r in kept])
        if len(classes) < 2:
            raise DataError(f"{cfg.recordings}: one {cfg.label} ('{classes[0]}'); a classifier needs at least two")
        note = Notes()
        train, cut = tensors(kept, cfg, classes, cast(str, cfg.recordings), note)
        valid, cut_valid = tensors(held, cfg, classes, cast(str, cfg.recordings), note)
        note.close()
        return AudioData(
            splits={"train": train, "valid": valid},
            labels=classes,
            batch_size=batching.batch_size,
            seed=batching.seed,
            cut=cut + cut_valid,
        )

    def saved_state(self, data: AudioData) -> dict[str, Any]:
        """The class names in id order."""
        return {"labels": data.labels}

    def data_shape(self, data: AudioData | None = None) -> DataShape:
        """The rate and clip length are the config's; the classes the data's (two before it is read)."""
        return DataShape(
            sample_rate=self.cfg.sample_rate,
            samples=self.cfg.samples,
            n_classes=len(data.labels) if data is not None else 2,
        )

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """Loss, accuracy, macro-F1 and the confusion matrix on a folder of recordings named as the
        training ones, read as they were."""
        self.refuse_split(split)
        note = Notes()
        recorded, _ = tensors(recordings_in(path), self.cfg, state["labels"], path, note)
        note.close()
        return evaluation_report(model, batches_of(*recorded, 64), state["labels"])

    @torch.no_grad()
    def predict(
        self,
        model: nn.Module,
        run: RunState,
        inputs: list[str],
        input_file: str | None,
        batch_size: int,
        **options: str,
    ) -> list[Prediction]:
        """Each audio file named, read as in training (a longer one cut, with a note)."""
        if input_file is not None or not inputs:
            raise UsageError("give the recordings to classify as arguments: attnlab predict RUN a.wav [more.wav ...]")
        cfg = self.cfg
        clips = read_clips(
            [Path(p) for p in inputs],
            cfg.sample_rate,
            cfg.samples,
            lambda line: print(f"note: {line}", file=sys.stderr),
        )
        for path, cut in zip(inputs, clips.cut):
            if cut:
                print(
                    f"note: {path}: longer than the model's {cfg.clip_seconds:g} s; its first {cfg.clip_seconds:g} s "
                    f"classified",
                    file=sys.stderr,
                )
        model.eval()
        device = next(model.parameters()).device
        waveforms, lengths = torch.from_numpy(clips.waveforms), torch.from_numpy(clips.lengths)
        probabilities = torch.cat(
            [
                cast(Classifier, model).classify(w.to(device), n.to(device)).float().softmax(-1).cpu()  # a classifier
                for w, n in zip(torch.split(waveforms, batch_size), torch.split(lengths, batch_size))
            ]
        )
        return list(zip(inputs, probabilities.tolist()))

    def describe(self, data: AudioData) -> str:
        sizes = ", ".join(f"{name} {len(labels):,}" for name, (_, _, labels) in data.splits.items())
        samples = data.splits["train"][0].shape[1]
        return (
            f"recordings: {sizes}; {len(data.labels)} classes {', '.join(data.labels)}; clips of {samples:,} "
            f"samples ({data.cut:,} cut)"
        )
