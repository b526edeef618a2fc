"""Audio classification: a recording to one of a set of classes (``data.task: audio_classification``).

The recordings and their validation split are tasks/recordings.py's (``data.recordings``, a folder named
as FSDD's; ``valid_first`` .. ``valid_last`` or ``valid_speaker``: one fold of the speaker-held-out
protocol, recipes/audio/speaker_folds_sweep.yaml runs all six); ``label`` chooses what is learnt: the
``digit`` spoken or the ``speaker``. Each recording is read at ``sample_rate``, then cut to
``clip_seconds`` or zero-padded to it; a batch is the waveforms (B, S) and their lengths (B,) in samples
(models/audio.py's kind ``waveforms``): the model computes its own features.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import Tensor, nn

from attnlab.config import flattened, one_of
from attnlab.errors import ConfigError, DataError, UsageError
from attnlab.models.audio import WAVEFORMS
from attnlab.models.shape import DataShape
from attnlab.nn.interfaces import Classifier
from attnlab.tasks.abilities import Prediction, PredictsLabels, RunState
from attnlab.tasks.batching import Batching, Tokenizers, batch_seed
from attnlab.tasks.classifier_task import ClassifierTask, ExampleBatch, evaluation_report
from attnlab.tasks.image_classification import class_ids, class_names
from attnlab.tasks.recordings import Notes, Recording, Recordings, read_clips, recordings_in
from attnlab.tasks.task import TaskConfig, register_task

LABELS = ("digit", "speaker")


@dataclass(frozen=True)
class AudioClassificationConfig(TaskConfig):
    """The recordings (tasks/recordings.py: the folder, the validation split, the rate) and ``label``:
    digit or speaker; every clip cut or zero-padded to ``clip_seconds``."""

    source: Recordings = flattened(Recordings())
    label: str = "digit"
    clip_seconds: float = 1.0

    def check(self) -> None:
        one_of("label", self.label, LABELS)
        rate = self.source.sample_rate
        if not (math.isfinite(self.clip_seconds) and self.clip_seconds > 0):
            raise ConfigError(f"clip_seconds must be a positive number of seconds (got {self.clip_seconds})")
        if self.samples < 1:
            raise ConfigError(f"clip_seconds ({self.clip_seconds}) is less than one sample at {rate} Hz")
        if self.source.valid_speaker is not None and self.label == "speaker":
            raise ConfigError(
                f"valid_speaker ('{self.source.valid_speaker}') holds a speaker out, so label 'speaker' would be "
                f"scored on a class it never trained: hold out by index (valid_first, valid_last) or learn the digit"
            )

    def check_trainable(self) -> None:
        self.source.folder("audio_classification")

    @property
    def samples(self) -> int:
        """The clips' length in samples."""
        return round(self.clip_seconds * self.source.sample_rate)


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
    clips = read_clips([r.path for r in recordings], cfg.source.sample_rate, cfg.samples, note)
    ids = class_ids([r.label(cfg.label) for r in recordings], classes, where)
    return (torch.from_numpy(clips.waveforms), torch.from_numpy(clips.lengths), ids), int(clips.cut.sum())


@register_task
class AudioClassification(PredictsLabels, ClassifierTask[AudioData, AudioBatch]):
    """A label for each recording (data.task: audio_classification), scored by loss, accuracy and macro-F1."""

    name = "audio_classification"
    config = AudioClassificationConfig
    needs = {"inputs": WAVEFORMS, "encoder": False}  # one label a clip (a recogniser writes a sequence)
    commands = ("predict", "evaluate", "inspect")
    cfg: AudioClassificationConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> AudioData:
        cfg = self.cfg
        kept, held = cfg.source.split(self.name)
        folder = cast(str, cfg.source.recordings)  # given: split read it
        classes = state["labels"] if state else class_names([r.label(cfg.label) for r in kept])
        if len(classes) < 2:
            raise DataError(f"{folder}: one {cfg.label} ('{classes[0]}'); a classifier needs at least two")
        note = Notes()
        train, cut = tensors(kept, cfg, classes, folder, note)
        valid, cut_valid = tensors(held, cfg, classes, folder, note)
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
            sample_rate=self.cfg.source.sample_rate,
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
            cfg.source.sample_rate,
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
