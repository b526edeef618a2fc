"""`attnlab inspect` on one audio file.

:func:`inspect_transcript`, a speech recogniser (views/speech_recognition.py): its log-mel spectrogram,
every attention module's weights, and how the transcript lines up with time (``alignment.png``,
Bahdanau's figure: output tokens down, frame tokens across): an encoder-decoder's cross-attention of its
last layer (the heads' mean), or a CTC model's posterior of each output digit's symbol at each frame token.

:func:`inspect_sound`, a classifier of sound (views/audio_classification.py): its prediction, every
attention module's weights and their entropy, and, for a model whose tokens tile the spectrogram (an
AST's patches, a frames model's frame pairs: nn/interfaces.py's SpectrogramTokens), what the summary
(the class token, the AST's two tokens, or the mean of the tokens) attends to, drawn on the spectrogram
per layer and head (low bands at the bottom), and the attention rollout across the layers.

For the encoder-decoder, each output digit's *centroid* is the mean time of its cross-attention; read
left to right, a monotonic alignment's centroids increase, which summary.json records (``centroids``
in seconds, ``monotonic``). A CTC model's alignment is monotonic by construction (a path reads the frames
in order), so its summary records none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.analysis.capture import AttentionRecord, attention_of, capture_attention
from attnlab.analysis.heads import attention_rollout, head_entropy
from attnlab.analysis.inspect import FigureDir, module_entry
from attnlab.analysis.plots import (
    alignment_plot,
    attention_heatmaps,
    entropy_plot,
    patch_attention_plot,
    spectrogram_plot,
)
from attnlab.data.audio import read_audio
from attnlab.data.tokenizers import BOS, Tokenizer
from attnlab.decode.spec import Beam, Greedy, Search
from attnlab.errors import UsageError
from attnlab.files import atomic_write_text
from attnlab.nn.interfaces import Classifier, CTCModel, SpectrogramTokens
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.recordings import Notes, read_clips
from attnlab.tasks.transcribers import transcriber_of

TIME_LABEL_EVERY = 5  # frame tokens between two time labels on an axis


def centroids(weights: Tensor, seconds: Tensor) -> list[float]:
    """(T_out, T) weights of each output over the frame tokens, (T,) each token's time -> each output's
    weighted mean time, in seconds."""
    return (weights / weights.sum(-1, keepdim=True) @ seconds).tolist()


def alignment_of(model: nn.Module, waves: Tensor, ids: list[int]) -> tuple[dict[str, AttentionRecord], Tensor]:
    """Every attention module's weights, and the (len(ids), T) alignment of the module docstring."""
    if isinstance(model, CTCModel):
        with torch.no_grad(), capture_attention(model) as captured:
            log_probs, _ = model.ctc_log_probs(waves)  # (1, T, V)
        return captured.last(), log_probs[0, :, ids].exp().T  # (len(ids), T)
    records = attention_of(model, waves, torch.tensor([[BOS] + ids], device=waves.device))
    last_cross = [r for r in records.values() if r.kind == "cross"][-1]
    return records, last_cross.probs[0].mean(0)[: len(ids)]  # (len(ids), T): the digits' rows, not EOS's


def inspect_transcript(
    run: RunDir, model: nn.Module, tokenizer: Tokenizer, path: str, target: str | None, beam: int, figures: FigureDir
) -> dict[str, Any]:
    """The recogniser on the audio file ``path`` (read at the run's rate, as `transcribe` reads it) and its
    transcript (``target``, or the search's of ``beam``): the figures of the module docstring, and
    summary.json."""
    device = next(model.parameters()).device
    rate = run.read_shape().need("sample_rate", "a speech recognition run")
    waves = torch.from_numpy(read_audio(path, rate).samples)[None].to(device)  # (1, S)
    if target is not None:
        ids = tokenizer.encode(target)
        if not ids:
            raise UsageError("--tgt is empty after tokenisation; give the digits spoken, as '3 5 1'")
    else:
        search: Search = Beam(width=beam) if beam > 1 else Greedy()
        ids = transcriber_of(model).search(search).decode(model, waves)[0][0][0]
    out = figures()
    spectrogram = cast(Any, model).spectrogram  # every recogniser's front end (nn/audio.py's Spectrogram)
    hop = spectrogram.log_mel.hop / rate  # seconds a frame
    records, alignment = alignment_of(model, waves, ids)
    seconds = (torch.arange(alignment.shape[-1], device=device) * 2 + 1) * hop  # a token's two frames' middle
    times = [f"{s:.2f}" if t % TIME_LABEL_EVERY == 0 else "" for t, s in enumerate(seconds.tolist())]
    words = tokenizer.id_tokens(ids)
    files = [
        spectrogram_plot(spectrogram.features(waves)[0], hop, f"{path}: log-mel spectrogram", out / "spectrogram.png")
    ]
    summary: dict[str, Any] = {"run": str(run.path), "source": path, "transcript": tokenizer.decode(ids)}
    summary |= {"target_given": target is not None, "modules": {}}
    for name, record in records.items():
        summary["modules"][name] = module_entry(record, head_entropy(record.probs))
        rows = times if record.kind == "self" and record.stack == "encoder" else tokenizer.id_tokens([BOS] + ids)
        cols = tokenizer.id_tokens([BOS] + ids) if record.stack == "decoder" and record.kind == "self" else times
        files.append(
            attention_heatmaps(
                record.probs[0], rows, cols, name, out / f"{record.stack}-{record.layer}-{record.kind}.png"
            )
        )
    files.append(
        alignment_plot(alignment, times, words, f"{path}: the transcript over time (s)", out / "alignment.png")
    )
    ctc = isinstance(model, CTCModel)
    summary["centroids"] = None if ctc else centroids(alignment, seconds)
    summary["monotonic"] = True if ctc else all(a < b for a, b in zip(summary["centroids"], summary["centroids"][1:]))
    summary |= {"out": str(out), "files": [str(f) for f in files]}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def on_spectrogram(image: Tensor) -> np.ndarray:
    """(n_mels, F) image -> the picture patch_attention_plot (and the explorer's page) draws on:
    (n_mels, F, 1) in [0, 1], the highest band first (rows are drawn top down: the low bands at the bottom)."""
    picture = image.flip(0).float()
    picture = (picture - picture.min()) / (picture.max() - picture.min()).clamp(min=1e-12)
    return picture[..., None].cpu().numpy()


def spectrogram_tokens(model: SpectrogramTokens, waves: Tensor, lengths: Tensor) -> tuple[Tensor, tuple[int, int]]:
    """The (n_mels, F) spectrogram a model of sound tokens reads of one clip (in eval mode: no masks drawn)
    and the (rows, columns) grid of its tokens over it."""
    image = cast(Any, model).spectrogram(waves, lengths)[0][0, 0]  # (n_mels, F)
    return image, model.spectrogram_grid(image[None, None])


def token_times(model: nn.Module, n_tokens: int) -> list[str]:
    """The time of each of a frames model's ``n_tokens`` tokens (the middle of its two frames), in seconds."""
    log_mel = cast(Any, model).spectrogram.log_mel
    hop = log_mel.hop / log_mel.rate
    return [f"{(2 * t + 1) * hop:.2f} s" for t in range(n_tokens)]


@torch.no_grad()
def inspect_sound(run: RunDir, model: nn.Module, cfg: Any, path: str, figures: FigureDir) -> dict[str, Any]:
    """A classifier of sound on the audio file ``path``, read as `predict` reads it (at the run's rate, cut
    or padded to its clip): the figures of the module docstring, and summary.json."""
    if not cfg.capabilities.attention_weights:
        raise UsageError(f"{run.path} holds a model of arch '{cfg.arch}', which has no attention to inspect")
    shape, names = run.read_shape(), run.read_task_state()["labels"]
    note = Notes()
    clips = read_clips([Path(path)], shape.need("sample_rate"), shape.need("samples"), note)
    note.close()
    device = next(model.parameters()).device
    waves, lengths = torch.from_numpy(clips.waveforms).to(device), torch.from_numpy(clips.lengths).to(device)
    model.eval()
    with capture_attention(model) as captured:
        p = cast(Classifier, model).classify(waves, lengths)[0].softmax(-1)  # a classifier of sound
    records = captured.last()
    out = figures()
    summary: dict[str, Any] = {
        "run": str(run.path),
        "source": path,
        "prediction": {"label": names[int(p.argmax())], "probabilities": dict(zip(names, p.tolist()))},
        "modules": {},
        "out": str(out),
        "files": [],
    }
    entropies = {name: head_entropy(record.probs) for name, record in records.items()}
    for name, record in records.items():
        summary["modules"][name] = module_entry(record, entropies[name])
        tokens = [str(t) for t in range(record.probs.shape[-1])]
        summary["files"].append(
            str(attention_heatmaps(record.probs[0], tokens, tokens, name, out / f"{record.stack}-{record.layer}.png"))
        )
    if isinstance(model, SpectrogramTokens):
        summary |= drawn_on_spectrogram(model, waves, lengths, records, path, out, summary["files"])
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def drawn_on_spectrogram(
    model: SpectrogramTokens,
    waves: Tensor,
    lengths: Tensor,
    records: dict[str, AttentionRecord],
    path: str,
    out: Path,
    files: list[str],
) -> dict[str, Any]:
    """The spectrogram, and the summary's attention over the tokens drawn on it, per layer (one panel a
    head) and rolled out across the layers; the maps, and the grid, for summary.json."""
    image, grid = spectrogram_tokens(model, waves, lengths)  # (n_mels, F), as the model reads it
    over_tokens = cast(Any, model).summary.attention_over_patches  # (..., T, T) -> (..., N)
    picture = on_spectrogram(image)
    hop = cast(Any, model).spectrogram.log_mel.hop / cast(Any, model).spectrogram.log_mel.rate
    files.append(str(spectrogram_plot(image.T, hop, f"{path}: log-mel spectrogram", out / "spectrogram.png")))
    maps = {}
    for name, record in records.items():
        weights = torch.unflatten(over_tokens(record.probs[0]), -1, grid).flip(
            -2
        )  # (H, rows, columns), low at the bottom
        maps[name] = weights.tolist()
        heads = [f"head {h}" for h in range(len(weights))]
        title = f"{name}: the summary's attention over the spectrogram"
        files.append(
            str(
                patch_attention_plot(
                    picture, weights, heads, title, out / f"{record.stack}-{record.layer}-spectrogram.png"
                )
            )
        )
    rollout = torch.unflatten(over_tokens(attention_rollout(r.probs for r in records.values())[0]), -1, grid).flip(-2)
    files.append(
        str(
            patch_attention_plot(
                picture,
                rollout[None],
                ["rollout"],
                f"attention rollout over {len(records)} layers",
                out / "rollout.png",
            )
        )
    )
    return {"grid": list(grid), "token_attention": maps, "rollout": rollout.tolist()}
