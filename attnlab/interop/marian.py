"""Marian (``model_type: marian``: MarianMTModel, the Helsinki-NLP opus-mt models) <-> attnlab's
``encoder_decoder`` family.

A Marian model is the paper's Transformer with a few settings of attnlab's options: post-norm
layers, sinusoidal positions laid out as Marian lays them (``positions.scheme: sinusoidal_halves``: every
sine, then every cosine, no dimension shuffled), the token embedding scaled by sqrt(d) or not
(``scale_embedding``: ``embeddings.kind: scaled`` or ``plain``), one embedding table shared by source,
target and output projection (``embeddings.tie: all``), and a bias per token on the logits, its
``final_logits_bias`` (``output.bias: true``). Its separate query, key and value projections are
concatenated into attnlab's fused ones (interop/marian_weights.py names the weights both ways).

The vocabulary: Marian's vocab.json has ``</s>``, ``<unk>`` and ``<pad>``, and its decoder starts
from ``<pad>`` (``decoder_start_token_id``); attnlab's tokenizers keep <pad> 0, <bos> 1, <eos> 2,
<unk> 3. Marian's pad, end and unknown take ids 0, 2 and 3, every other token keeps its order from
id 4, and <bos> is added at 1 with the decoder start's embedding row, so that attnlab's decoding,
which starts from <bos>, starts as Marian's does. The added <bos> is never predicted
(``output.vocabulary: no_bos``: its logit is -inf), so the distribution over Marian's own tokens is
exactly the original's. init.json's
``order`` gives each id the original's (null for <bos>). The text is cut into pieces by the
model's own source.spm and target.spm (spm.py), which vocab.json numbers.

A run trained by attnlab exports with every id, its <bos> (id 1) the decoder's start and a special
token of tokenizer_config.json (transformers' decode leaves it out); such a folder imports back as
it was, its <bos> kept rather than added (``output.vocabulary: all``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn

from attnlab.data.tokenizers import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Tokenizer
from attnlab.errors import CheckpointError
from attnlab.interop.folder import (
    Exported,
    HFConverter,
    Imported,
    checked_config,
    read_json,
    read_weights,
    register_converter,
    unlike,
)
from attnlab.interop.marian_weights import marian_tensors, tensor_pairs
from attnlab.interop.spm import FOREIGN, spm_model, spm_tokenizer
from attnlab.models import FamilyConfig, build_model
from attnlab.models.encoder_decoder import EncoderDecoderConfig
from attnlab.models.shape import DataShape
from attnlab.nn.registry import ATTENTION_BACKENDS
from attnlab.runs.init import InitReport, copy_tensors, named_tensors
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import TaskConfig, task_config
from attnlab.tasks.parts import Text

ACTIVATIONS = {
    "swish": "silu",
    "silu": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}  # Marian's activation_function -> attnlab's
LANGUAGE_CODE = re.compile(r">>.+<<")  # a multilingual model's target language, typed before the text


def marian_model_fields(
    config: dict[str, Any], where: Path, output_vocabulary: str = "no_bos"
) -> tuple[dict[str, Any], DataShape]:
    """attnlab's encoder_decoder model section for a Marian config.json, and the data's sizes
    (vocab_size: Marian's plus the added <bos> where ``output.vocabulary`` is ``no_bos``; a folder that
    has attnlab's <bos> keeps its ids: ``all``). Options attnlab cannot represent are refused in one
    line naming them."""
    must = {
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "normalize_before": False,
        "add_final_layer_norm": False,
        "normalize_embedding": False,
    }
    unsupported = [f"{name} {config[name]!r}" for name, fine in must.items() if name in config and config[name] != fine]
    for ours, (a, b) in {
        "n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
        "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
        "vocab_size": ("vocab_size", "decoder_vocab_size"),
    }.items():
        if config.get(b) is not None and config.get(a) != config[b]:
            unsupported.append(f"{a} {config.get(a)} unlike {b} {config[b]} (attnlab has one {ours})")
    if config.get("activation_function", "gelu") not in ACTIVATIONS:
        unsupported.append(f"activation_function {config['activation_function']!r} (have {', '.join(ACTIVATIONS)})")
    if unsupported:
        raise CheckpointError(f"{where}: {'; '.join(unsupported)}: not representable in attnlab's encoder_decoder")
    try:
        stack = {
            "d_model": config["d_model"],
            "n_heads": config["encoder_attention_heads"],
            "n_layers": config["encoder_layers"],
            "d_ff": config["encoder_ffn_dim"],
            "dropout": config.get("dropout", 0.1),
            "attention_dropout": config.get("attention_dropout", 0.0),
            "activation": ACTIVATIONS[config.get("activation_function", "gelu")],
            "norm": "post",
            "layer_norm_eps": 1e-5,
            "attention_backend": "sdpa",
        }
        added = 1 if output_vocabulary == "no_bos" else 0
        return (
            {
                "arch": "encoder_decoder",
                "stack": stack,
                "depths": {"encoder": config["encoder_layers"], "decoder": config["decoder_layers"]},
                "positions": {"scheme": "sinusoidal_halves", "max_len": config["max_position_embeddings"]},
                "output": {"bias": True, "vocabulary": output_vocabulary},
                "embeddings": {"kind": "scaled" if config.get("scale_embedding", False) else "plain", "tie": "all"},
            },
            DataShape(vocab_size=config["vocab_size"] + added, pad_id=PAD),
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which a Marian config.json has") from None


def renumbered_vocabulary(folder: Path, config: dict[str, Any]) -> tuple[list[str], list[int | None], list[str]]:
    """vocab.json's tokens by attnlab id (Marian's pad, end and unknown at 0, 2, 3 under attnlab's
    names, <bos> added at 1, the others in their order from 4), ``order`` (each id's original, None
    for an added <bos>) and the language codes. A folder attnlab exported has its <bos> already,
    as the decoder's start: that token is the <bos>, nothing is added."""
    vocab = read_json(folder / "vocab.json")
    if not all(isinstance(i, int) for i in vocab.values()) or sorted(vocab.values()) != list(range(len(vocab))):
        raise CheckpointError(f"{folder / 'vocab.json'}: the ids are not 0 .. {len(vocab) - 1}, each once")
    if len(vocab) != config["vocab_size"]:
        raise CheckpointError(
            f"{folder / 'vocab.json'}: {len(vocab)} tokens, config.json's vocab_size is {config['vocab_size']}"
        )
    names = {i: token for token, i in vocab.items()}
    roles = {"pad": config.get("pad_token_id"), "eos": config.get("eos_token_id"), "unk": vocab.get("<unk>")}
    absent = [f"{role} ({i})" for role, i in roles.items() if i not in names]
    if absent:
        raise CheckpointError(f"{folder}: no token in vocab.json for {', '.join(absent)}")
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    bos = vocab.get(SPECIAL_TOKENS[BOS]) if vocab.get(SPECIAL_TOKENS[BOS]) == start else None  # attnlab's export
    clashes = [t for t in SPECIAL_TOKENS if t in vocab and vocab[t] not in (*roles.values(), bos)]
    if clashes:
        raise CheckpointError(
            f"{folder / 'vocab.json'}: has {', '.join(clashes)} as text, which attnlab keeps for control"
        )
    order: list[int | None] = [roles["pad"], bos, roles["eos"], roles["unk"]]
    order += sorted(set(names) - set(order))
    tokens = [SPECIAL_TOKENS[new] if new <= UNK else names[old] for new, old in enumerate(order)]
    return tokens, order, [t for t in tokens if LANGUAGE_CODE.fullmatch(t)]


EXPORTED_ACTIVATIONS = {"silu": "swish", "gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
MARIAN_NAMES = {"<pad>": "<pad>", "<eos>": "</s>", "<unk>": "<unk>"}  # attnlab's control tokens in vocab.json


class TextSection(Protocol):
    """What :func:`export_refusals` reads of an encoder_decoder run's data section (translation's):
    its ``text`` part (tasks/parts.py)."""

    @property
    def text(self) -> Text: ...


def export_refusals(cfg: EncoderDecoderConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
    """The run's options that Marian has no counterpart for, each 'field value (Marian's)'."""
    needs = {
        "positions.scheme": "sinusoidal_halves",
        "positions.combine": "add",
        "positions.base": 10000.0,
        "stack.norm": "post",
        "stack.normalisation": "layer",
        "stack.residual": True,
        "stack.ffn": True,
        "embeddings.tie": "all",
        "stack.attention_scale": "sqrt_dk",
        "stack.layer_norm_eps": 1e-5,
    }
    refused = unlike(cfg, needs, "Marian's")
    if cfg.embeddings.kind not in ("scaled", "plain"):
        refused.append(
            f"embeddings.kind {cfg.embeddings.kind!r} (Marian scales by sqrt(d) or not: 'scaled' or 'plain')"
        )
    if cfg.stack.activation not in EXPORTED_ACTIVATIONS:
        refused.append(f"activation {cfg.stack.activation!r} (Marian has {', '.join(map(repr, EXPORTED_ACTIVATIONS))})")
    if not ATTENTION_BACKENDS[cfg.stack.attention_backend].exact:
        refused.append(f"attention_backend {cfg.stack.attention_backend!r} (Marian attends to every token)")
    if run is not None and run.read_pruned_heads():
        refused.append("pruned heads (Marian has the same heads in every layer)")
    tokenizer = cast(TextSection, data).text.tokenizer  # an encoder_decoder run's task reads text
    if tokenizer != "unigram":
        refused.append(f"data.text.tokenizer {tokenizer!r} (Marian reads SentencePiece unigram models: 'unigram')")
    elif (
        not getattr(getattr(data, "pairs", None), "shared_vocab", True)
        if run is None  # a config: its sides get their own vocabularies
        else len(
            {
                tuple(vocabulary(tok, run.read_shape().need("vocab_size")))
                for tok in run.read_tokenizers().values()
                if tok
            }
        )
        > 1
    ):
        refused.append("separate source and target vocabularies (Marian's one vocab.json numbers both sides)")
    return refused


def vocabulary(tokenizer: Tokenizer, size: int) -> list[str]:
    """The token of each id, as vocab.json names it (attnlab's control tokens under Marian's names)."""
    return [MARIAN_NAMES.get(token, token).removeprefix(FOREIGN) for token in tokenizer.id_tokens(range(size))]


def exported_ids(vocab_size: int, run: RunDir) -> tuple[list[int], int]:
    """For each Marian id of the export, the run's token id, and the export's id of the decoder's
    start: a run imported from Marian puts its tokens back at their ids (init.json's order) and
    drops the added <bos>, starting from the original start; another keeps every id and starts
    from <bos>."""
    init = run.read_init() if run.init.is_file() else {}
    order = init.get("order")
    if isinstance(order, list) and len(order) == vocab_size and order[BOS] is None:
        # init.json's start, a token id (mypy reads dict.get with an Any default as Any | None)
        return [order.index(old) for old in range(vocab_size - 1)], cast(int, init.get("start", order[PAD]))
    return list(range(vocab_size)), BOS


def export_marian(
    model: nn.Module, cfg: EncoderDecoderConfig, tokenizers: dict[str, Tokenizer], run: RunDir
) -> Exported:
    """MarianMTModel of a run that passed :func:`export_refusals`."""
    vocab_size = run.read_shape().need("vocab_size", "a Marian export")
    ids, start = exported_ids(vocab_size, run)
    state = {name: t.float() for name, t in model.state_dict().items()}
    state.setdefault("generator.bias", torch.zeros(vocab_size))  # output.bias false: Marian's zero bias
    tensors = {}
    for ours, theirs in tensor_pairs(cfg).items():
        tensor = state[ours][:vocab_size][ids] if ours in ("src_embed.tokens.weight", "generator.bias") else state[ours]
        for name, part in zip(theirs, tensor.chunk(len(theirs))):
            tensors[name] = part
    tensors["final_logits_bias"] = tensors["final_logits_bias"][None]  # (1, V)
    tokens = vocabulary(tokenizers["tgt"], vocab_size)
    config = {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "vocab_size": len(ids),
        "decoder_vocab_size": len(ids),
        "d_model": cfg.stack.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.stack.n_heads,
        "decoder_attention_heads": cfg.stack.n_heads,
        "encoder_ffn_dim": cfg.stack.d_ff,
        "decoder_ffn_dim": cfg.stack.d_ff,
        "activation_function": EXPORTED_ACTIVATIONS[cfg.stack.activation],
        "dropout": cfg.stack.dropout,
        "attention_dropout": cfg.stack.attn_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": cfg.positions.max_len,
        "scale_embedding": cfg.embeddings.kind == "scaled",
        "pad_token_id": ids.index(PAD),
        "eos_token_id": ids.index(EOS),
        "decoder_start_token_id": start,
        "forced_eos_token_id": ids.index(EOS),
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "model_max_length": cfg.positions.max_len,
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    kept_bos = {"bos_token": SPECIAL_TOKENS[BOS]} if BOS in ids else {}  # the decoder's start: special, never decoded
    control = {token: MARIAN_NAMES[token] for token in (SPECIAL_TOKENS[EOS], SPECIAL_TOKENS[PAD])}
    files: dict[str, str | bytes] = {
        "vocab.json": json.dumps({tokens[i]: new for new, i in enumerate(ids)}, ensure_ascii=False),
        "source.spm": spm_model(tokenizers["src"], control),
        "target.spm": spm_model(tokenizers["tgt"], control),
        "tokenizer_config.json": json.dumps(tokenizer_config | kept_bos) + "\n",
    }
    return Exported(config, tensors, files)


@register_converter
class MarianConverter(HFConverter):
    """MarianMTModel / MarianModel -> encoder_decoder (a translation run: translate, inspect, prune, serve)."""

    model_type = "marian"
    arch = "encoder_decoder"
    described = "Marian, opus-mt"
    tokenizer_files = (("vocab.json", "source.spm", "target.spm"),)

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        if (folder / "target_vocab.json").is_file():
            raise CheckpointError(
                f"{folder}: separate source and target vocabularies (target_vocab.json) are not "
                f"imported; attnlab's Marian shares one table"
            )
        tokens, order, codes = renumbered_vocabulary(folder, config)
        fields, shape = marian_model_fields(config, folder / "config.json", "no_bos" if order[BOS] is None else "all")
        tokenizers = {
            role: spm_tokenizer(folder / f"{side}.spm", tokens, codes)
            for role, side in (("src", "source"), ("tgt", "target"))
        }
        cfg = checked_config(fields, shape, folder / "config.json", EncoderDecoderConfig)
        start = config.get("decoder_start_token_id", config["pad_token_id"])
        model = build_model(cfg, shape)
        target = named_tensors(model)
        shapes = {name: tuple(t.shape) for name, t in target.items()}
        tensors, unused = marian_tensors(read_weights(folder), cfg, shapes, order, start, folder / "model.safetensors")
        loaded = copy_tensors(target, tensors, str(folder / "model.safetensors"))
        longest = min(cfg.positions.max_len - 1, 512)  # + EOS (source) or BOS (target input)
        data = task_config(
            {
                "task": "translation",
                "format": "tsv",
                "text": {"tokenizer": "unigram", "vocab_size": shape.vocab_size},
                "pairs": {"shared_vocab": False, "max_src_len": longest, "max_tgt_len": longest},
            }
        )
        report = InitReport(str(folder), loaded, [name for name in target if name not in tensors], unused, untrained=[])
        return Imported(
            model,
            cfg,
            shape,
            data,
            tokenizers,
            report,
            {"order": order, "start": start},
            TrainConfig(progress=False, label_smoothing=0.0),
        )

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, EncoderDecoderConfig)  # refusal and export-ct2 ask it of encoder_decoder runs alone
        return export_refusals(cfg, data, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, EncoderDecoderConfig)  # export_hf's converter of arch encoder_decoder
        return export_marian(model, cfg, tokenizers, run)
