"""The figures of ``attnlab inspect`` for the models that read an image (analysis/inspect.py draws those
that read text, and holds what every kind shares: the figures' folder, summary.json's entry of a
module). :func:`inspect_image`: an image model reads an image file, as `predict` does: per layer,
what the class token (or, with mean pooling, the mean of the patches) attends to over the patch
grid, drawn on the image per head, and the attention rollout across the layers (Abnar & Zuidema
2020). :func:`inspect_caption`: a captioner reads an image file and captions it (or takes --tgt): for
each word, its cross-attention over the patch grid drawn on the image, per decoder layer and head and
averaged over the heads (the figure of Xu et al. 2015, "Show, Attend and Tell"). A single-stream
model reads an image file and a question (analysis/cross_modal.py).
"""

from __future__ import annotations

import json
from typing import Any, cast

import torch
from torch import nn

from attnlab.analysis.capture import attention_of, capture_attention
from attnlab.analysis.heads import attention_rollout, head_entropy
from attnlab.analysis.inspect import FigureDir, module_entry
from attnlab.analysis.plots import attention_heatmaps, entropy_plot, patch_attention_plot
from attnlab.data.images import colour_of, read_image
from attnlab.data.tokenizers import BOS, EOS, Tokenizer
from attnlab.decode.search import beam_search
from attnlab.errors import UsageError
from attnlab.files import atomic_write_text
from attnlab.nn.interfaces import Classifier
from attnlab.nn.vision import PatchEncoding
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.captions import read_input_images
from attnlab.tasks.image_classification import read_inputs


@torch.no_grad()
def inspect_image(run: RunDir, model: nn.Module, cfg: Any, path: str, figures: FigureDir) -> dict[str, Any]:
    """An image model on the image file ``path``, read as `predict` reads it: its prediction, and
    for each layer the attention of the image's summary (the class token; with mean pooling the
    mean over the queries) over the patch grid, per head, drawn on the image; then the rollout."""
    if not cfg.capabilities.attention_weights:
        raise UsageError(f"{run.path} holds a model of arch '{cfg.arch}', which has no attention to inspect")
    state = run.read_task_state()
    images = read_inputs([path], run).to(next(model.parameters()).device)  # (1, C, H, W), standardised
    model.eval()
    with capture_attention(model) as captured:
        p = cast(Classifier, model).classify(images)[0].softmax(-1)  # an image classifier
    records = captured.last()
    out = figures()
    picture = read_image(path, colour_of(state["shape"]), tuple(state["shape"][:2])) / 255.0  # (H, W, C), as read
    over_patches = cast(PatchEncoding, model).summary.attention_over_patches  # (..., T, T) -> (..., N)
    names = state["labels"]
    grid = cfg.patches.grid(run.read_shape())  # (h, w) patches
    summary: dict[str, Any] = {
        "run": str(run.path),
        "source": path,
        "grid": list(grid),
        "modules": {},
        "prediction": {"label": names[int(p.argmax())], "probabilities": dict(zip(names, p.tolist()))},
        "out": str(out),
        "files": [],
    }
    entropies = {}
    for name, record in records.items():
        maps = torch.unflatten(over_patches(record.probs[0]), -1, grid)  # (H, h, w)
        entropies[name] = head_entropy(record.probs)
        summary["modules"][name] = module_entry(record, entropies[name]) | {"patch_attention": maps.tolist()}
        summary["files"].append(
            str(
                patch_attention_plot(
                    picture,
                    maps,
                    [f"head {h}" for h in range(len(maps))],
                    f"{name}: attention over the patches",
                    out / f"{record.stack}-{record.layer}-patches.png",
                )
            )
        )
    rollout = torch.unflatten(over_patches(attention_rollout(r.probs for r in records.values())[0]), -1, grid)  # (h, w)
    summary["rollout"] = rollout.tolist()
    summary["files"].append(
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
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


@torch.no_grad()
def inspect_caption(
    run: RunDir,
    model: nn.Module,
    cfg: Any,
    tokenizer: Tokenizer,
    path: str,
    target: str | None,
    beam: int,
    figures: FigureDir,
) -> dict[str, Any]:
    """A captioner on the image file ``path`` (read as `caption` reads it) and its caption (``target``,
    or beam search's): one teacher-forced pass over the caption, as for a translation. Per decoder
    layer, each word's cross-attention over the patch grid drawn on the image, one figure per head
    and one of the heads' mean; the self-attention as heatmaps; the entropies."""
    device = next(model.parameters()).device
    images = read_input_images([path], run).to(device)  # (1, C, H, W), standardised
    if target is not None:
        ids = tokenizer.encode(target)
        if not ids:
            raise UsageError("--tgt is empty after tokenisation; give a caption of known words")
    else:
        ids = beam_search(model, images, beam=beam, max_len=cfg.positions.max_len - 1)[0][0].tokens
    tgt_in = torch.tensor([[BOS] + ids], device=device)  # (1, T)
    records = attention_of(model, images, tgt_in)
    out = figures()
    shape = run.read_task_state()["shape"]  # (H, W, C)
    picture = read_image(path, colour_of(shape), tuple(shape[:2])) / 255.0  # (H, W, C), as read
    words = tokenizer.id_tokens(ids + [EOS])  # what each decoder position predicts
    shape = run.read_shape()
    grid, patches, inputs = cfg.patches.grid(shape), cfg.patches.labels(shape), tokenizer.id_tokens(tgt_in[0].tolist())
    summary: dict[str, Any] = {
        "run": str(run.path),
        "source": path,
        "grid": list(grid),
        "target": tokenizer.decode(ids),
        "target_tokens": words,
        "target_given": target is not None,
        "modules": {},
        "out": str(out),
        "files": [],
    }
    entropies = {}
    for name, record in records.items():
        entropies[name] = head_entropy(record.probs)
        summary["modules"][name] = module_entry(record, entropies[name])
        stem = f"{record.stack}-{record.layer}-{record.kind}"
        if record.kind != "cross":
            labels = patches if record.stack == "encoder" else inputs
            summary["files"].append(str(attention_heatmaps(record.probs[0], labels, labels, name, out / f"{stem}.png")))
            continue
        maps = torch.unflatten(record.probs[0], -1, grid)  # (H, T, h, w): each word's weights over the patches
        summary["modules"][name]["word_attention"] = maps.tolist()
        panels = {f"head{h}": (maps[h], f"head {h}") for h in range(len(maps))}
        panels["mean"] = (maps.mean(0), "mean over the heads")
        for suffix, (drawn, title) in panels.items():  # drawn: (T, h, w)
            summary["files"].append(
                str(
                    patch_attention_plot(
                        picture,
                        drawn,
                        words,
                        f"{name}, {title}: each word's attention over the patches",
                        out / f"{stem}-{suffix}.png",
                    )
                )
            )
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
