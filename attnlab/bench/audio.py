"""What a model that computes its own features pays for them (issue 62): for each tokenisation of sound,
the training step with the features computed inside the model, as attnlab trains, against the same
model, same weights, whose front end was computed once beforehand (its output on the batch replayed,
:class:`Precomputed`); and the log-mel features alone against transformers' WhisperFeatureExtractor
with the same bands, window and hop.

The models are recipes/audio/'s digit classifiers (8 kHz, 1 s clips, batches of 32, 10 classes):
``frames`` (whisper_encoder: log-mel frames through a convolutional stem), ``patches`` (ast: 2-D
patches of the log-mels), ``waveform`` (waveform_transformer: frames of samples in three streams, each
decimated by an anti-aliasing filter) and ``convolutions`` (audio_cnn, the baseline over the same log-mels).
Their front ends are LogMel (the spectrogram) and Decimation (the waveform's streams); SpecAugment,
which draws its masks after the features, runs in both columns. One step is the forward, cross-entropy,
backward and an AdamW update; the figure is seconds of audio a second, the median of interleaved steps.

The log-mels alone are compared at Whisper's own settings (16 kHz, 80 bands, 25 ms windows every 10 ms),
on the same 32 clips at 16 kHz, both padded to the 1 s of the longest (the extractor's chunk_length 1,
not its 30 s): attnlab's LogMel on the device against the extractor's call on the arrays (its own
torch path on the CPU), with the largest difference of their features.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.bench.device import device_fields
from attnlab.bench.timing import CPU, interleaved_medians
from attnlab.models import DataShape, build_model, model_config
from attnlab.nn.interfaces import Classifier
from attnlab.nn.spectrogram import KaldiFbank, LogMel
from attnlab.nn.waveform import Decimation

RATE, SECONDS, BATCH, CLASSES = 8000, 1.0, 32, 10
STACK = {"d_model": 64, "n_heads": 4, "n_layers": 4, "d_ff": 128, "dropout": 0.1}
MEL = {"n_mels": 32, "window_ms": 25.0, "hop_ms": 20.0}
AUGMENT = {"freq_masks": 2, "freq_width": 4, "time_masks": 2, "time_width": 5}
MODELS: dict[str, dict[str, Any]] = {  # tokenisation -> the model section of its recipe in recipes/audio/
    "frames": {"arch": "whisper_encoder", "features": MEL, "augment": AUGMENT, "stack": STACK},
    "patches": {
        "arch": "ast",
        "features": MEL,
        "augment": AUGMENT,
        "patches": {"size": 8, "positional": "learned_2d"},
        "stack": STACK,
    },
    "waveform": {
        "arch": "waveform_transformer",
        "waveform": {"frame_ms": 20.0, "streams": 3, "decimation": 10},
        "stack": STACK,
    },
    "convolutions": {"arch": "audio_cnn", "features": MEL, "augment": AUGMENT, "width": 16},  # the baseline
}
FRONT_ENDS = (LogMel, KaldiFbank, Decimation)
REFERENCE, WHISPER_RATE = "transformers.WhisperFeatureExtractor", 16_000


class Precomputed(nn.Module):
    """A front end's output on the bench's one batch, replayed: the model it stands in trains as before,
    less the cost of that front end (whose ``hop`` and count of ``frames``, a filterbank's, it keeps)."""

    def __init__(self, output: Tensor, front_end: nn.Module) -> None:
        super().__init__()
        self.output, self.hop, self.count = output, getattr(front_end, "hop", None), getattr(front_end, "frames", None)

    def forward(self, _: Tensor) -> Tensor:
        return self.output

    def frames(self, samples: Tensor) -> Tensor:
        assert self.count is not None  # a filterbank's: the spectrogram asks it
        frames: Tensor = self.count(samples)
        return frames


def precomputed(model: nn.Module, waveforms: Tensor, lengths: Tensor) -> nn.Module:
    """A copy of ``model`` (same weights) whose front ends (FRONT_ENDS) give their output on this batch."""
    twin = copy.deepcopy(model)
    outputs: dict[str, Tensor] = {}
    hooks = [
        module.register_forward_hook(lambda m, args, out, name=name: outputs.__setitem__(name, out.detach()))
        for name, module in twin.named_modules()
        if isinstance(module, FRONT_ENDS)
    ]
    with torch.no_grad():
        classify(twin, waveforms, lengths)
    for hook in hooks:
        hook.remove()
    for name, output in outputs.items():
        parent, _, child = name.rpartition(".")
        owner = twin.get_submodule(parent)
        setattr(owner, child, Precomputed(output, getattr(owner, child)))
    return twin


def classify(model: nn.Module, waveforms: Tensor, lengths: Tensor) -> Tensor:
    assert isinstance(model, Classifier)  # the bench's models are classifiers of sound
    return model.classify(waveforms, lengths)


def training_step(model: nn.Module, waveforms: Tensor, lengths: Tensor, labels: Tensor) -> Callable[[], None]:
    """One step of AdamW on the batch's cross-entropy."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(classify(model, waveforms, lengths), labels).backward()
        optimizer.step()

    return step


def batch(seed: int, device: torch.device, rate: int = RATE) -> tuple[Tensor, Tensor, Tensor]:
    """BATCH clips of noisy tones, each 0.5-1 s of the SECONDS at ``rate`` (zero-padded), and their labels."""
    g = torch.Generator().manual_seed(seed)
    samples = int(rate * SECONDS)
    lengths = torch.randint(samples // 2, samples + 1, (BATCH,), generator=g)  # (B,)
    t = torch.arange(samples) / rate
    pitch = 200.0 + 3000.0 * torch.rand(BATCH, 1, generator=g)
    waves = 0.5 * torch.sin(2 * torch.pi * pitch * t) + 0.05 * torch.randn(BATCH, samples, generator=g)
    waves = waves * (torch.arange(samples)[None, :] < lengths[:, None])  # (B, S)
    return waves.to(device), lengths.to(device), torch.randint(0, CLASSES, (BATCH,), generator=g).to(device)


def whisper_features(waveforms: Tensor) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """attnlab's LogMel and transformers' WhisperFeatureExtractor at Whisper's settings on the (B, S)
    16 kHz clips, each a call giving (B, frames, n_mels)."""
    import transformers

    log_mel = LogMel().to(waveforms.device)  # Whisper's: 16 kHz, n_fft 400, hop 160, 80 bands
    extractor_class: Any = transformers.WhisperFeatureExtractor  # its __init__ is unannotated
    extractor = extractor_class(chunk_length=round(SECONDS))
    clips = list(waveforms.cpu().numpy())

    def theirs() -> Tensor:
        out = extractor(clips, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
        return out.transpose(1, 2)  # (B, n_mels, frames) -> (B, frames, n_mels)

    return lambda: log_mel(waveforms), theirs


def bench_audio(
    repeats: int = 10, seed: int = 0, device: torch.device = CPU, with_hf: bool = True
) -> Iterator[dict[str, Any]]:
    """One record per tokenisation (MODELS: its training step against its twin with precomputed front
    ends), then, ``with_hf``, the log-mels against WhisperFeatureExtractor."""
    waveforms, lengths, labels = batch(seed, device)
    audio = BATCH * SECONDS  # seconds of audio a step
    fields = {"batch": BATCH, "seconds": SECONDS, "sample_rate": RATE} | device_fields(device)
    shape = DataShape(sample_rate=RATE, samples=int(RATE * SECONDS), n_classes=CLASSES)
    for name, section in MODELS.items():
        torch.manual_seed(seed)
        model = build_model(model_config(section), shape).to(device)
        twin = precomputed(model, waveforms, lengths)
        steps = {
            "inside": training_step(model, waveforms, lengths, labels),
            "precomputed": training_step(twin, waveforms, lengths, labels),
        }
        seconds = interleaved_medians(steps, repeats, warmup=2, device=device)
        yield {
            "name": f"audio_train_{name}",
            "value": round(audio / seconds["inside"], 1),
            "unit": "audio s/s",
            "reference": "the same model, its front end precomputed",
            "reference_value": round(audio / seconds["precomputed"], 1),
            "ratio": round(seconds["precomputed"] / seconds["inside"], 3),
            "arch": section["arch"],
        } | fields
    if with_hf:
        sound = batch(seed, device, rate=WHISPER_RATE)[0]
        ours, theirs = whisper_features(sound)
        seconds = interleaved_medians({"attnlab": ours, "hf": theirs}, repeats, warmup=2, device=device)
        yield (
            {
                "name": "audio_features_log_mel",
                "value": round(audio / seconds["attnlab"], 1),
                "unit": "audio s/s",
                "reference": REFERENCE,
                "reference_value": round(audio / seconds["hf"], 1),
                "ratio": round(seconds["hf"] / seconds["attnlab"], 3),
                "max_abs_difference": (ours().cpu() - theirs()).abs().max().item(),
            }
            | fields
            | {"sample_rate": WHISPER_RATE}
        )
