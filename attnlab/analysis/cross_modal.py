"""``attnlab inspect`` on a single-stream model (arch single_stream): one image and one question
through it, and the blocks of each layer's attention map over the joint sequence [words; patches]:

- text -> image: what each word (the [CLS] first) attends to among the patches, drawn on the image,
  heads averaged, and per head the words' mean;
- image -> text: how much attention the patches give each word, per head and averaged;
- text -> text: the question's own block, per head (all the text-only baseline has);

then both cross-modal blocks averaged over the layers and heads, an entropy plot, and summary.json
with the answer, every block per layer and head, and each head's share of attention that crosses
from one modality to the other.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import Tensor, nn

from attnlab.analysis.capture import AttentionRecord, capture_attention
from attnlab.analysis.heads import head_entropy
from attnlab.analysis.plots import attention_heatmaps, block_plot, entropy_plot, patch_attention_plot
from attnlab.data.images import colour_of, read_image
from attnlab.errors import UsageError
from attnlab.files import atomic_write_text
from attnlab.nn.single_stream import IMAGE, TEXT, SingleStreamTransformer
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.captions import read_input_images
from attnlab.tasks.visual_qa import VisualQAConfig, question_ids


def blocks(probs: Tensor, modality: Tensor) -> dict[str, Tensor]:
    """(H, T + N, T + N) weights of one layer, each token's modality (T + N,) -> the blocks
    'text_to_text' (H, T, T), 'text_to_image' (H, T, N) and 'image_to_text' (H, N, T), queries
    first."""
    text, image = modality == TEXT, modality == IMAGE
    return {
        "text_to_text": probs[:, text][:, :, text],
        "text_to_image": probs[:, text][:, :, image],
        "image_to_text": probs[:, image][:, :, text],
    }


def crossing(block: Tensor) -> list[float]:
    """(H, Tq, Tk) block -> each head's share of its queries' attention that the block holds (their mean)."""
    return [round(float(share), 4) for share in block.sum(-1).mean(-1)]


@torch.no_grad()
def cross_modal_pass(
    model: nn.Module, images: Tensor, ids: Tensor
) -> tuple[Tensor, dict[str, AttentionRecord], Tensor]:
    """One image (1, C, H, W), standardised, and its question (1, T) through the model (as `ask`
    reads them): the answer logits (n_answers,), each module's weights over the joint sequence, and
    each token's modality (T + N,), which :func:`blocks` cuts them by (`inspect` and `serve` both)."""
    model.eval()
    stream = cast(SingleStreamTransformer, model)  # arch single_stream's model
    with capture_attention(model) as captured:
        logits = stream.classify(images, ids)[0]
    return logits, captured.last(), stream.sequence(images, ids)[2]


@torch.no_grad()
def inspect_single_stream(
    run: RunDir, model: nn.Module, cfg: Any, path: str, question: str | None, figures: Callable[[], Path]
) -> dict[str, Any]:
    """The model on the image file ``path`` (read as `ask` reads it) and ``question``: its answer,
    and the figures and summary.json of the module docstring."""
    if question is None:
        raise UsageError(
            'a single-stream run answers a question about the image: give --src IMAGE and --question "..."'
        )
    state, data_cfg, grid = run.read_task_state(), run.read_config()[1], cfg.patches.grid(run.read_shape())
    tokenizer = run.read_tokenizers()["src"]
    assert tokenizer is not None  # a visual QA run's questions have one
    device = next(model.parameters()).device
    images = read_input_images([path], run).to(device)  # (1, C, H, W), standardised
    longest = cast(VisualQAConfig, data_cfg).max_question_len  # a single-stream model answers visual QA
    ids = torch.tensor([question_ids(tokenizer, [question], longest, "--question")[0]], device=device)
    logits, records, modality = cross_modal_pass(model, images, ids)
    p = logits.float().softmax(-1)
    out = figures()
    words = tokenizer.id_tokens(ids[0].tolist())
    picture = read_image(path, colour_of(state["shape"]), tuple(state["shape"][:2])) / 255.0  # (H, W, C)
    answers = state["labels"]
    summary: dict[str, Any] = {
        "run": str(run.path),
        "source": path,
        "question": question,
        "question_tokens": words,
        "grid": list(grid),
        "image_tokens": int((modality == IMAGE).sum()),
        "prediction": {"label": answers[int(p.argmax())], "probabilities": dict(zip(answers, p.tolist()))},
        "modules": {},
        "out": str(out),
        "files": [],
    }
    entropies, per_layer = {}, []
    for name, record in records.items():
        layer = blocks(record.probs[0], modality)
        per_layer.append(layer)
        entropies[name] = head_entropy(record.probs)
        summary["modules"][name] = (
            {
                "layer": record.layer,
                "heads": record.probs.shape[1],
                "entropy": [round(float(e), 4) for e in entropies[name]],
                "uniform_entropy": round(math.log(record.probs.shape[-1]), 4),
            }
            | {kind: block.tolist() for kind, block in layer.items()}
            | {f"{kind}_share": crossing(layer[kind]) for kind in ("text_to_image", "image_to_text")}
        )
        stem = f"{record.stack}-{record.layer}"
        summary["files"].append(
            str(
                attention_heatmaps(
                    layer["text_to_text"], words, words, f"{name}: the question's words", out / f"{stem}-text.png"
                )
            )
        )
        if summary["image_tokens"]:
            summary["files"] += draw_cross_modal(picture, layer, words, grid, f"layer {record.layer}", out / stem)
    if summary["image_tokens"]:
        mean = {
            kind: torch.stack([layer[kind] for layer in per_layer]).mean((0, 1))[None]
            for kind in ("text_to_image", "image_to_text")
        }  # (1, ., .): layers and heads averaged
        summary["files"] += draw_cross_modal(
            picture, mean, words, grid, f"{len(per_layer)} layers averaged", out / "averaged"
        )
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def draw_cross_modal(
    picture: Any, layer: dict[str, Tensor], words: list[str], grid: tuple[int, int], what: str, stem: Path
) -> list[str]:
    """The two cross-modal blocks of ``layer`` (H heads, or one average), drawn: each word's
    attention over the patches on the image, heads averaged (STEM-text-to-image.png); with several
    heads, each head's mean over the words (STEM-text-to-image-heads.png); and the attention the
    patches give each word, their mean, per head and averaged (STEM-image-to-text.png)."""
    to_image, to_text = layer["text_to_image"], layer["image_to_text"]  # (H, T, N), (H, N, T)
    H = to_image.shape[0]
    files = [
        patch_attention_plot(
            picture,
            torch.unflatten(to_image.mean(0), -1, grid),
            words,
            f"{what}: each word's attention over the patches (heads averaged)",
            Path(f"{stem}-text-to-image.png"),
        )
    ]
    if H > 1:
        files.append(
            patch_attention_plot(
                picture,
                torch.unflatten(to_image.mean(1), -1, grid),
                [f"head {h}" for h in range(H)],
                f"{what}: the words' mean attention over the patches, per head",
                Path(f"{stem}-text-to-image-heads.png"),
            )
        )
    rows = [f"head {h}" for h in range(H)] + ["mean"] if H > 1 else ["heads averaged"]
    given = to_text.mean(1)  # (H, T): the patches' mean attention to each word
    files.append(
        block_plot(
            torch.cat([given, given.mean(0, keepdim=True)]) if H > 1 else given,
            rows,
            words,
            f"{what}: the patches' mean attention to each word",
            Path(f"{stem}-image-to-text.png"),
        )
    )
    return [str(f) for f in files]
