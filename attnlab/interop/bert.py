"""Importing a Hugging Face BERT-family folder (``model_type: bert``) as an attnlab run (`attnlab import-hf
DIR --out RUN`).

Reads ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (the WordPiece tokenizer, through
the ``tokenizers`` library), checked as folder.py checks every folder. The result is a
run of the ``encoder_only`` family that ``inspect`` and ``train.init_from`` take like any other: of
data.task ``masked_lm`` (which ``fill-mask`` serves) when the folder has BERT's masked-LM head
(``BertForMaskedLM``), else of data.task ``encoder`` (tasks/encoder.py: ``BertModel``, an encoder and
its pooler, no head), whose head and classifier a fine-tuned run takes as untrained.

BERT's encoder is attnlab's with ``embeddings.kind: normed`` (LayerNorm(E[w] + P[pos] + S[type]), no
sqrt(d) scale), post-norm layers, exact GELU, learned positions and a segment table of
``type_vocab_size`` rows; attention runs through PyTorch's fused ``sdpa`` backend (`inspect` swaps
in the explicit one to draw the weights). The weights map one to one, the separate query, key and value
projections concatenated into the fused one (interop/bert_weights.py names the weights both ways).

attnlab's tokenizers keep their control tokens at fixed ids (<pad> 0, <bos> 1, <eos> 2, <unk> 3,
<mask> 4). BERT's [PAD] [CLS] [SEP] [UNK] [MASK] take those ids and names ([CLS] a [SEP] b [SEP] is
exactly attnlab's <bos> a <eos> b <eos>); every other token keeps its order after them, and the rows
of the embedding and of the output bias move with their tokens, so the model computes what the
original computes. A token id of the original is ``order.index(id)`` here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch
from tokenizers import processors
from torch import nn

from attnlab.data.tokenizers import MASK_TOKEN, PAD, SPECIAL_TOKENS, Tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop.bert_weights import VOCABULARY_ROWS, bert_pairs, load_bert
from attnlab.interop.folder import (
    HIDDEN_ACTS,
    Exported,
    HFConverter,
    Imported,
    read_json,
    read_weights,
    register_converter,
    renumbered_spec,
    unlike,
)
from attnlab.models import FamilyConfig, build_model, model_config
from attnlab.models.encoder_only import EncoderOnlyConfig
from attnlab.models.shape import DataShape
from attnlab.nn.encoder_only import EncoderOnly
from attnlab.nn.registry import ACTIVATIONS, ATTENTION_BACKENDS
from attnlab.runs.init import InitReport
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import TaskConfig, task_config

BERT_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")  # -> <pad> <bos> <eos> <unk> <mask>, ids 0-4


def bert_model_fields(config: dict[str, Any], where: Path | str) -> tuple[dict[str, Any], DataShape]:
    """attnlab's encoder_only model section for a Hugging Face BERT config.json, and the data's
    sizes it was trained on (its vocabulary)."""
    kind = config.get("model_type")
    if kind != "bert":
        raise CheckpointError(
            f"{where}: model_type is {kind!r}; attnlab imports BERT-family folders "
            f"(model_type 'bert', e.g. BERT, MiniLM, all-MiniLM-L6-v2)"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            f"{where}: position_embedding_type {config['position_embedding_type']!r} is not "
            f"imported (only 'absolute', BERT's learned positions)"
        )
    act = config.get("hidden_act", "gelu")  # BERT's "gelu" is the exact one, as attnlab's
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{where}: hidden_act {act!r} is not imported (have {', '.join(ACTIVATIONS)})")
    try:
        stack = {
            "d_model": config["hidden_size"],
            "n_heads": config["num_attention_heads"],
            "n_layers": config["num_hidden_layers"],
            "d_ff": config["intermediate_size"],
            "dropout": config.get("hidden_dropout_prob", 0.1),
            "attention_dropout": config.get("attention_probs_dropout_prob", 0.1),
            "activation": act,
            "norm": "post",
            "layer_norm_eps": config.get("layer_norm_eps", 1e-12),
            "attention_backend": "sdpa",
        }
        return (
            {
                "arch": "encoder_only",
                "stack": stack,
                "positions": {"scheme": "learned", "max_len": config["max_position_embeddings"]},
                "embeddings": {"kind": "normed", "tie": "output"},
                "n_segments": config.get("type_vocab_size", 2),
                "classifier": {"pooling": "cls", "head": "pooled"},
            },
            DataShape(vocab_size=config["vocab_size"], pad_id=PAD),
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which a BERT config.json has") from None


def renumbered_tokenizer(path: Path) -> tuple[Tokenizer, list[int]]:
    """The WordPiece tokenizer of ``tokenizer.json`` with BERT's specials at attnlab's control ids,
    and ``order``: the original id of each new id."""
    spec = read_json(path)
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise CheckpointError(f"{path}: a {model.get('type')!r} tokenizer; BERT's is 'WordPiece'")
    vocab: dict[str, int] = model["vocab"]
    missing = [token for token in BERT_SPECIALS if token not in vocab]
    if missing:
        raise CheckpointError(f"{path}: the vocabulary has no {', '.join(missing)}")
    order = [vocab[token] for token in BERT_SPECIALS]
    order += sorted(set(vocab.values()) - set(order))
    names = dict(zip(BERT_SPECIALS, SPECIAL_TOKENS + [MASK_TOKEN]))
    new_id = {old: new for new, old in enumerate(order)}
    model["vocab"] = {names.get(token, token): new_id[old] for token, old in vocab.items()}
    model["unk_token"] = names["[UNK]"]
    spec["added_tokens"] = [
        entry | {"id": new_id[entry["id"]], "content": names.get(entry["content"], entry["content"])}
        for entry in spec.get("added_tokens", [])
        if entry.get("id") in new_id
    ]
    spec["post_processor"] = spec["truncation"] = spec["padding"] = None  # attnlab adds <bos>/<eos> itself
    try:
        return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec))), order
    except Exception as err:  # the library raises a plain Exception for a malformed file
        raise CheckpointError(f"{path}: not a tokenizer file the library reads ({err})") from None


def export_refusals(cfg: EncoderOnlyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
    """The run's options that BERT has no counterpart for, each 'field value (BERT's)'."""
    needs = {
        "embeddings.kind": "normed",
        "positions.scheme": "learned",
        "positions.combine": "add",
        "stack.norm": "post",
        "stack.normalisation": "layer",
        "stack.residual": True,
        "stack.ffn": True,
        "embeddings.tie": "output",
        "stack.attention_scale": "sqrt_dk",
        "classifier.pooling": "cls",
        "classifier.head": "pooled",
    }
    refused = unlike(cfg, needs, "BERT's")
    if cfg.stack.activation not in HIDDEN_ACTS:
        refused.append(f"activation {cfg.stack.activation!r} (BERT has {', '.join(map(repr, HIDDEN_ACTS))})")
    if not ATTENTION_BACKENDS[cfg.stack.attention_backend].exact:
        refused.append(f"attention_backend {cfg.stack.attention_backend!r} (BERT attends to every token)")
    if run is not None and run.read_pruned_heads():
        refused.append("pruned heads (BERT has num_attention_heads in every layer)")
    return refused


def exported_ids(vocab_size: int, run: RunDir) -> tuple[list[int], dict[str, str]]:
    """For each BERT id of the export, the run's token id, and the control tokens' names there: a
    run imported from BERT puts its tokens back at their original ids under BERT's names; another
    keeps its ids and names."""
    order = run.read_init().get("order") if run.init.is_file() else None
    if isinstance(order, list) and sorted(order) == list(range(vocab_size)):
        names = dict(zip(SPECIAL_TOKENS + [MASK_TOKEN], BERT_SPECIALS))
        return [order.index(old) for old in range(vocab_size)], names
    return list(range(vocab_size)), {}


def exported_tokenizer(tokenizer: Tokenizer, ids: list[int], rename: dict[str, str]) -> tuple[str, dict[str, str]]:
    """tokenizer.json at the export's ids, which puts [CLS] a [SEP] (b [SEP]) around a text as BERT
    does, and the names of its control tokens (tokenizer_config.json's)."""
    hf = tokenizers.Tokenizer.from_str(json.dumps(renumbered_spec(tokenizer, ids, rename)))
    names = {
        role: rename.get(token, token)
        for role, token in zip(
            ("pad_token", "cls_token", "sep_token", "unk_token", "mask_token"), SPECIAL_TOKENS + [MASK_TOKEN]
        )
    }
    if hf.token_to_id(names["mask_token"]) is None:
        del names["mask_token"]
    sep_id, cls_id = hf.token_to_id(names["sep_token"]), hf.token_to_id(names["cls_token"])
    assert sep_id is not None and cls_id is not None  # attnlab's tokenizers hold every control token but <mask>
    hf.post_processor = processors.BertProcessing((names["sep_token"], sep_id), (names["cls_token"], cls_id))
    return hf.to_str(), names


def export_bert(model: nn.Module, cfg: EncoderOnlyConfig, tokenizer: Tokenizer, run: RunDir) -> Exported:
    """BertForMaskedLM (a masked-LM run) or BertModel (any other encoder_only run: its pooler is the
    classifier's) of a run that passed :func:`export_refusals`."""
    shape = run.read_shape()
    vocab_size = shape.need("vocab_size", "a BERT export")
    ids, rename = exported_ids(vocab_size, run)
    with_head = run.read_config()[1].task.name == "masked_lm"
    state = {name: t.float() for name, t in model.state_dict().items()}
    state.setdefault("embed.segments.weight", torch.zeros(1, cfg.stack.d_model))  # no segments: one zero row
    tensors = {}
    for ours, theirs in bert_pairs(cfg.stack.n_layers).items():
        if ours.startswith("mlm_head.") and not with_head:
            continue
        tensor = state[ours][:vocab_size][ids] if ours in VOCABULARY_ROWS else state[ours]
        for name, part in zip(theirs, tensor.chunk(len(theirs))):
            tensors[("bert." if with_head and not name.startswith("cls.") else "") + name] = part
    text, names = exported_tokenizer(tokenizer, ids, rename)
    config = {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM" if with_head else "BertModel"],
        "vocab_size": vocab_size,
        "hidden_size": cfg.stack.d_model,
        "num_hidden_layers": cfg.stack.n_layers,
        "num_attention_heads": cfg.stack.n_heads,
        "intermediate_size": cfg.stack.d_ff,
        "hidden_act": HIDDEN_ACTS[cfg.stack.activation],
        "hidden_dropout_prob": cfg.stack.dropout,
        "attention_probs_dropout_prob": cfg.stack.attn_dropout,
        "max_position_embeddings": cfg.positions.max_len,
        "type_vocab_size": max(cfg.segment_rows(shape), 1),
        "layer_norm_eps": cfg.stack.layer_norm_eps,
        "pad_token_id": ids.index(PAD),
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }
    wordpiece = json.loads(text)["model"]["type"] == "WordPiece"
    tokenizer_config = {
        "tokenizer_class": "BertTokenizerFast" if wordpiece else "PreTrainedTokenizerFast",
        "model_max_length": cfg.positions.max_len,
    } | names
    return Exported(
        config,
        tensors,
        {"tokenizer.json": text, "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n"},
    )


@register_converter
class BertConverter(HFConverter):
    """BertModel / BertForMaskedLM -> encoder_only (a masked-LM run with the head, else an encoder run)."""

    model_type = "bert"
    arch = "encoder_only"
    described = "BERT, MiniLM, all-MiniLM-L6-v2"

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        fields, shape = bert_model_fields(config, folder / "config.json")
        tokenizer, order = renumbered_tokenizer(folder / "tokenizer.json")
        if tokenizer.vocab_size != shape.vocab_size:
            raise CheckpointError(
                f"{folder}: tokenizer.json has {tokenizer.vocab_size} tokens, config.json's "
                f"vocab_size is {shape.vocab_size}"
            )
        try:
            cfg = model_config(fields)
            model = build_model(cfg, shape)
            assert isinstance(cfg, EncoderOnlyConfig) and isinstance(model, EncoderOnly)  # arch: encoder_only
        except ConfigError as err:
            raise CheckpointError(f"{folder / 'config.json'}: {err}") from None
        loaded, new, unused = load_bert(model, read_weights(folder), order, folder / "model.safetensors")
        with_head = not any(name.startswith("mlm_head.") for name in new)
        data = task_config(
            {
                "task": "masked_lm" if with_head else "encoder",
                "text": {"tokenizer": "wordpiece", "vocab_size": shape.vocab_size},
                "max_len": cfg.positions.max_len,
            }
        )
        report = InitReport(str(folder), loaded, new, unused, untrained=new)  # what the folder lacks stays random
        return Imported(
            model, cfg, shape, data, tokenizer, report, {"order": order}
        )  # new token id i is the original's order[i]

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, EncoderOnlyConfig)  # refusal asks it of encoder_only runs alone
        return export_refusals(cfg, data, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, EncoderOnlyConfig)  # export_hf's converter of arch encoder_only
        return export_bert(model, cfg, tokenizers["src"], run)
