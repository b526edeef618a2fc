"""Hugging Face ViT folders (``model_type: vit``) as attnlab runs and back (`attnlab import-hf DIR --out
RUN`, `attnlab export-hf RUN --out DIR`).

Reads ``config.json``, ``model.safetensors`` and, if present, ``preprocessor_config.json`` (the
image's rescale and normalisation), checked as folder.py checks every folder; a ViT has no
tokenizer. The result is a run of the ``vit`` family that ``predict``, ``inspect`` and
``train.init_from`` take like any other: of data.task ``image_classification`` when the folder has
a classifier (``ViTForImageClassification``, its classes config.json's ``id2label`` in id order),
else of data.task ``image_encoder`` (tasks/image_encoder.py: ``ViTModel``, an encoder and its
pooler, no output layer), which refuses `predict`.

Hugging Face's ViT is attnlab's with pre-norm layers, exact GELU, a class token, learned 1-D
positions, the final LayerNorm, ``head: linear`` (ViTForImageClassification's one Linear on the
class token's state) or ``head: pooled`` (ViTModel's pooler, tanh(W h_cls + b), is the tanh layer);
attention runs through PyTorch's fused ``sdpa`` backend. The weights map one to one
(interop/vit_weights.py names them both ways).

Hugging Face adds a position to the class token too; attnlab adds positions to the patches only
(nn/vision.py), so the class token here is the original's plus its position: the same sum, done
once. Images: Hugging Face's processor rescales the 0-255 pixels by ``rescale_factor`` (1/255)
and normalises by ``image_mean``/``image_std`` (0.5 each by default); attnlab standardises 0-255
pixels, so its mean and std are those divided by the rescale factor. Images are resized (bilinear)
to config.json's ``image_size``.

The export writes the run back (the map of vit_weights.py, read the other way: :func:`vit_pairs`): an
image_classification run with ``head: linear`` as ViTForImageClassification, an image_encoder run as
ViTModel with its pooler; the class token's position is zero and the class token holds it. Its
preprocessor_config.json is a ViTImageProcessor of the run's size (bilinear resize, as `predict`
does with an image of another size) and its task state's pixel statistics times 1/255. Options a
ViT has no counterpart for (2-D or no positions, mean pooling, post-norm, the pooled head of a
classifier, pruned heads) are refused in one line naming them all.
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError
from attnlab.interop.folder import (
    HIDDEN_ACTS,
    Exported,
    HFConverter,
    Imported,
    checked_config,
    read_json,
    read_weights,
    register_converter,
)
from attnlab.interop.vit_weights import CLS, CONV, POSITIONS, vit_pairs, vit_tensors
from attnlab.models import FamilyConfig, build_model
from attnlab.models.shape import DataShape
from attnlab.models.vit import ViTConfig
from attnlab.runs.init import InitReport, copy_tensors, named_tensors
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import TaskConfig, task_config

PREPROCESSOR = "preprocessor_config.json"
DEFAULT_MEAN = DEFAULT_STD = 0.5  # ViTImageProcessor's defaults (IMAGENET_STANDARD_MEAN / _STD)
RESCALE, BILINEAR = 1 / 255, 2  # ViTImageProcessor's rescale_factor and resample (PIL's BILINEAR)


def pair(value: Any, name: str, where: Path) -> tuple[int, int]:
    """config.json's image_size / patch_size: an int or (height, width)."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value[0], value[1]
    raise CheckpointError(f"{where}: {name} {value!r} is not an int or a (height, width) pair")


def vit_refusals(config: dict[str, Any]) -> list[str]:
    """The options of a ViT config.json that attnlab's vit family cannot represent, each with what it has."""
    refused = []
    if config.get("hidden_act", "gelu") != "gelu":
        refused.append(f"hidden_act {config['hidden_act']!r} (attnlab's ViT has 'gelu', the exact one)")
    if not config.get("qkv_bias", True):
        refused.append("qkv_bias false (attnlab's query, key and value projections have biases)")
    if config.get("pooler_act", "tanh") != "tanh":
        refused.append(f"pooler_act {config['pooler_act']!r} (attnlab's pooler is tanh)")
    if config.get("pooler_output_size") not in (None, config.get("hidden_size")):
        refused.append(f"pooler_output_size {config['pooler_output_size']} (attnlab's pooler keeps hidden_size)")
    if config.get("num_channels", 3) not in (1, 3):
        refused.append(f"num_channels {config['num_channels']} (attnlab reads images as RGB or greyscale)")
    return refused


def vit_model_fields(config: dict[str, Any], with_classifier: bool, where: Path) -> tuple[dict[str, Any], DataShape]:
    """attnlab's vit model section for a Hugging Face ViT config.json (encoder_stride, for masked
    image modelling's decoder, has no part in it), and the data's sizes: the image's, the classes."""
    refused = vit_refusals(config)
    (height, width), (patch_h, patch_w) = (
        pair(config.get(name, default), name, where) for name, default in (("image_size", 224), ("patch_size", 16))
    )
    if patch_h != patch_w:
        refused.append(f"patch_size {[patch_h, patch_w]} (attnlab's patches are square)")
    if refused:
        raise CheckpointError(f"{where}: {'; '.join(refused)}: not representable in attnlab's vit")
    try:
        shape = DataShape(
            image_height=height,
            image_width=width,
            channels=config.get("num_channels", 3),
            n_classes=len(labels_of(config, where)),
        )
        return {
            "arch": "vit",
            "patches": {"size": patch_h, "positional": "learned"},
            "classifier": {"pooling": "cls", "head": "linear" if with_classifier else "pooled"},
            "stack": {
                "d_model": config["hidden_size"],
                "n_heads": config["num_attention_heads"],
                "n_layers": config["num_hidden_layers"],
                "d_ff": config["intermediate_size"],
                "dropout": config.get("hidden_dropout_prob", 0.0),
                "attention_dropout": config.get("attention_probs_dropout_prob", 0.0),
                "activation": "gelu",
                "norm": "pre",
                "layer_norm_eps": config.get("layer_norm_eps", 1e-12),
                "attention_backend": "sdpa",
            },
        }, shape
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which a ViT config.json has") from None


def labels_of(config: dict[str, Any], where: Path) -> list[str]:
    """The class names in id order, from id2label (Hugging Face's LABEL_0, LABEL_1 without one)."""
    id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(config.get("num_labels", 2))}
    try:
        names = {int(i): str(name) for i, name in id2label.items()}
    except (AttributeError, ValueError):
        raise CheckpointError(f"{where}: id2label is not a map of class ids to names") from None
    if sorted(names) != list(range(len(names))) or len(names) < 2:
        raise CheckpointError(
            f"{where}: id2label has ids {sorted(names)}; attnlab's classifier needs ids 0..n-1, n >= 2"
        )
    return [names[i] for i in range(len(names))]


def pixel_statistics(folder: Path, channels: int) -> tuple[list[float], list[float]]:
    """attnlab's per-channel mean and std of 0-255 pixels that give what the folder's image
    processor feeds the model: ((x r) - m) / s = (x - m / r) / (s / r)."""
    path = folder / PREPROCESSOR
    spec = read_json(path) if path.is_file() else {}
    rescale = spec.get("rescale_factor", RESCALE) if spec.get("do_rescale", True) else 1.0
    normalise = spec.get("do_normalize", True)
    stats = []
    for name, default, plain in (("image_mean", DEFAULT_MEAN, 0.0), ("image_std", DEFAULT_STD, 1.0)):
        value = spec.get(name, default) if normalise else plain
        value = [value] * channels if isinstance(value, (int, float)) else value
        if not isinstance(value, list) or len(value) != channels:
            raise CheckpointError(f"{path}: {name} {value!r} is not {channels} numbers (one per channel)")
        stats.append([v / rescale for v in value])
    if any(s <= 0 for s in stats[1]):
        raise CheckpointError(f"{path}: image_std {spec.get('image_std')!r} has a value <= 0")
    return stats[0], stats[1]


# data.task -> the head its Hugging Face class has, and that class
ARCHITECTURES = {
    "image_classification": ("linear", "ViTForImageClassification"),
    "image_encoder": ("pooled", "ViTModel"),
}


def export_refusals(cfg: ViTConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
    """The run's options that ViT has no counterpart for, each 'field value (ViT's)'."""
    head, architecture = ARCHITECTURES[data.task.name]  # a vit run's tasks
    needs = {
        "patches.positional": ("learned", "ViT"),
        "patches.hop": (None, "ViT"),  # side by side
        "classifier.pooling": ("cls", "ViT"),
        "stack.norm": ("pre", "ViT"),
        "classifier.head": (head, architecture),
    }
    refused = [
        f"{name} {attrgetter(name)(cfg)!r} ({whose}'s is {value!r})"
        for name, (value, whose) in needs.items()
        if attrgetter(name)(cfg) != value
    ]
    if cfg.stack.activation not in HIDDEN_ACTS:
        refused.append(f"activation {cfg.stack.activation!r} (ViT has {', '.join(map(repr, HIDDEN_ACTS))})")
    if run is not None and run.read_pruned_heads():
        refused.append("pruned heads (ViT has num_attention_heads in every layer)")
    return refused


def export_vit(model: nn.Module, cfg: ViTConfig, run: RunDir) -> Exported:
    """ViTForImageClassification (an image_classification run) or ViTModel with its pooler (an
    image_encoder run) of a run that passed :func:`export_refusals`, and its ViTImageProcessor: the
    run's size (bilinear resize, as `predict`), its pixel statistics rescaled to 0-1 pixels."""
    task, shape = run.read_config()[1].task, run.read_shape()
    channels, height, width = (shape.need(name, "a ViT export") for name in ("channels", "image_height", "image_width"))
    state = {name: t.float() for name, t in model.state_dict().items()}
    tensors: dict[str, torch.Tensor] = {}
    for ours, theirs in vit_pairs(cfg.stack.n_layers).items():
        if ours in state and not ours.startswith(task.untrained):  # ViTModel: no output layer
            tensors |= dict(zip(theirs, state[ours].chunk(len(theirs))))
    d, P = cfg.stack.d_model, cfg.patches.size
    tensors[CONV] = state["patch_embed.projection.weight"].view(d, channels, P, P)
    tensors[POSITIONS] = torch.cat([torch.zeros(1, d), state["positional.table.weight"]])[None]  # the class token's: 0
    tensors[CLS] = state["summary.token"]  # which holds its position already
    architecture = ARCHITECTURES[task.name][1]
    if architecture == "ViTForImageClassification":
        tensors = {(name if name.startswith("classifier.") else f"vit.{name}"): t for name, t in tensors.items()}
    pixels = run.read_task_state()
    labels = dict(enumerate(pixels["labels"]))
    size = height if height == width else [height, width]
    config = {
        "model_type": "vit",
        "architectures": [architecture],
        "hidden_size": d,
        "num_hidden_layers": cfg.stack.n_layers,
        "num_attention_heads": cfg.stack.n_heads,
        "intermediate_size": cfg.stack.d_ff,
        "hidden_act": HIDDEN_ACTS[cfg.stack.activation],
        "hidden_dropout_prob": cfg.stack.dropout,
        "attention_probs_dropout_prob": cfg.stack.attn_dropout,
        "layer_norm_eps": cfg.stack.layer_norm_eps,
        "image_size": size,
        "patch_size": P,
        "num_channels": channels,
        "qkv_bias": True,
        "id2label": {str(i): name for i, name in labels.items()},
        "label2id": {name: i for i, name in labels.items()},
        "torch_dtype": "float32",
    }
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": height, "width": width},
        "resample": BILINEAR,
        "do_rescale": True,
        "rescale_factor": RESCALE,
        "do_normalize": True,
        "image_mean": [m * RESCALE for m in pixels["mean"]],
        "image_std": [s * RESCALE for s in pixels["std"]],
    }
    return Exported(config, tensors, {PREPROCESSOR: json.dumps(processor, indent=2) + "\n"})


@register_converter
class ViTConverter(HFConverter):
    """ViTForImageClassification / ViTModel -> vit (an image_classification run with the classifier,
    else an image_encoder run)."""

    model_type = "vit"
    arch = "vit"
    described = "ViT"
    tokenizer_files = ((),)  # images: no tokenizer

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        weights = read_weights(folder)
        with_classifier = "classifier.weight" in weights
        fields, shape = vit_model_fields(config, with_classifier, folder / "config.json")
        cfg = checked_config(fields, shape, folder / "config.json", ViTConfig)
        model = build_model(cfg, shape)
        tensors, unused = vit_tensors(weights, cfg.stack.n_layers)
        target = named_tensors(model)
        loaded = copy_tensors(target, tensors, str(folder / "model.safetensors"))
        new = [name for name in target if name not in tensors]
        square = shape.image_height == shape.image_width
        data = task_config(
            {
                "task": "image_classification" if with_classifier else "image_encoder",
                "images": {
                    "resize": shape.image_height if square else None,
                    "colour": "rgb" if shape.channels == 3 else "grey",
                },
            }
        )
        mean, std = pixel_statistics(folder, shape.need("channels"))
        state = {
            "labels": labels_of(config, folder / "config.json"),
            "shape": [shape.image_height, shape.image_width, shape.channels],
            "mean": mean,
            "std": std,
        }
        report = InitReport(str(folder), loaded, new, unused, untrained=new)  # what the folder lacks stays random
        return Imported(model, cfg, shape, data, None, report, task_state=state)

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, ViTConfig)  # refusal asks it of vit runs alone
        return export_refusals(cfg, data, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, ViTConfig)  # export_hf's converter of arch vit
        return export_vit(model, cfg, run)
