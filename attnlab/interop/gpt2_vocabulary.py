"""GPT-2's vocabulary between its files and a run's: a folder's tokenizer read as a run's (renumbered, or
kept where it already has attnlab's control ids) and the ids an export puts back; the weights are
interop/gpt2.py's.

The vocabulary: GPT-2's byte-level BPE has one special token, ``<|endoftext|>``, which ends (and
starts) its documents; attnlab's tokenizers keep <pad> 0, <bos> 1, <eos> 2, <unk> 3. The end of text
becomes <eos> at id 2, every other token keeps its order from id 4, and <pad>, <bos> and <unk> are
added at 0, 1 and 3 with the end of text's embedding row (GPT-2 starts a text after it). They are
never predicted: the run has ``output: {vocabulary: text}``, their logits -inf, so that the
distribution over GPT-2's own tokens is exactly the original's. init.json's ``order`` gives each
new id the original's (null for the three added), and the export puts every token back there.

The export takes any decoder_lm run whose options GPT-2 has; a run trained by attnlab exports with
its whole vocabulary, control tokens included (its <pad>, <bos>, <eos> are GPT-2's pad, bos and eos
ids), and its own tokenizer.json (byte-level BPE, BPE, WordPiece, Unigram or a character / word
WordLevel, as transformers' PreTrainedTokenizerFast reads it). Such a folder imports back as it was:
its control tokens already at attnlab's ids, every id is kept and predicted (``output.vocabulary:
all``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from attnlab.data.tokenizers import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Tokenizer
from attnlab.errors import CheckpointError
from attnlab.interop.folder import read_json
from attnlab.models.decoder_lm import DecoderLMConfig
from attnlab.runs.run_dir import RunDir

END_OF_TEXT = "<|endoftext|>"
ADDED = (PAD, BOS, UNK)  # control ids GPT-2's vocabulary has no token for


def byte_level_spec(folder: Path) -> dict[str, Any]:
    """The folder's tokenizer as the library's JSON: tokenizer.json, or one built from GPT-2's
    original vocab.json + merges.txt (byte-level BPE, GPT-2's pre-tokenizer and decoder)."""
    if (folder / "tokenizer.json").is_file():
        return read_json(folder / "tokenizer.json")
    try:
        tok = tokenizers.Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    except Exception as err:  # the library raises a plain Exception for malformed files
        raise CheckpointError(f"{folder}: vocab.json + merges.txt are not a BPE tokenizer ({err})") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id(END_OF_TEXT) is not None:
        tok.add_special_tokens([END_OF_TEXT])
    return json.loads(tok.to_str())


class Vocabulary(NamedTuple):
    """The run's tokenizer, ``order`` (the original id of each run id; None for a token added), the
    end of text's name, the run's ``output.vocabulary`` and ``data.text.tokenizer``."""

    tokenizer: Tokenizer
    order: list[int | None]
    end_of_text: str
    output_vocabulary: str
    kind: str


def token_ids(model: dict[str, Any]) -> dict[str, int]:
    """A tokenizer.json model's token -> id (a Unigram's vocab: [token, log-probability] pairs by id)."""
    vocab = model["vocab"]
    return {entry[0]: i for i, entry in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)


KINDS = {"BPE": "bpe", "WordLevel": "word", "WordPiece": "wordpiece", "Unigram": "unigram"}  # -> data.text.tokenizer
PRE_TOKENIZED_KINDS: dict[tuple[str, str | None], str] = {
    ("BPE", "ByteLevel"): "byte_bpe",
    ("WordLevel", "Split"): "char",
}  # (model, pre-tokenizer)


def tokenizer_kind(spec: dict[str, Any]) -> str:
    """The ``data.text.tokenizer`` whose pipeline (data/tokenizers.py) a tokenizer.json's model and
    pre-tokenizer are."""
    model, pre = spec["model"]["type"], (spec.get("pre_tokenizer") or {}).get("type")
    return PRE_TOKENIZED_KINDS.get((model, pre), KINDS[model])


def keeps_attnlab_controls(vocab: dict[str, int], config: dict[str, Any]) -> bool:
    """Whether a folder numbers its tokens as attnlab does (<pad> 0, <bos> 1, <eos> 2, <unk> 3, as
    config.json's pad, bos and eos ids): the export of a run attnlab trained."""
    roles = {"pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS}
    return all(vocab.get(token) == i for i, token in enumerate(SPECIAL_TOKENS)) and all(
        config.get(role, i) == i for role, i in roles.items()
    )


def renumbered_tokenizer(folder: Path, config: dict[str, Any]) -> Vocabulary:
    """The folder's tokenizer as a run's. A folder that keeps attnlab's control tokens at their ids
    (:func:`keeps_attnlab_controls`) keeps every id and predicts every token; GPT-2's own gets its end
    of text as <eos> (id 2), <pad> <bos> <unk> added at 0, 1, 3 and the other tokens in order from 4."""
    spec = byte_level_spec(folder)
    where = folder / ("tokenizer.json" if (folder / "tokenizer.json").is_file() else "vocab.json")
    model = spec.get("model") or {}
    if model.get("type") not in KINDS or not isinstance(model.get("vocab"), (dict, list)):
        raise CheckpointError(
            f"{where}: a {model.get('type')!r} tokenizer; attnlab's GPT-2 reads {', '.join(map(repr, KINDS))}"
        )
    vocab = token_ids(model)
    for entry in spec.get("added_tokens", []):  # the end of text may be an added token only
        vocab.setdefault(entry["content"], entry["id"])
    if len(vocab) != config["vocab_size"]:
        raise CheckpointError(f"{where}: {len(vocab)} tokens, config.json's vocab_size is {config['vocab_size']}")
    kind = tokenizer_kind(spec)
    byte_level = kind == "byte_bpe"
    if keeps_attnlab_controls(vocab, config):
        return Vocabulary(library_tokenizer(spec, where), list(range(len(vocab))), SPECIAL_TOKENS[EOS], "all", kind)
    if model["type"] == "Unigram":
        raise CheckpointError(
            f"{where}: a 'Unigram' tokenizer without attnlab's {' '.join(SPECIAL_TOKENS)} at ids "
            f"0-3; attnlab reads GPT-2's own tokenizer as 'BPE', 'WordLevel' or 'WordPiece'"
        )
    eos_id = config.get("eos_token_id", 50256)
    names = {i: token for token, i in vocab.items()}
    if eos_id not in names:
        raise CheckpointError(f"{where}: no token has config.json's eos_token_id {eos_id}")
    clashes = [token for token in SPECIAL_TOKENS if token in vocab and vocab[token] != eos_id]
    if clashes:
        raise CheckpointError(
            f"{where}: the vocabulary has {', '.join(clashes)} as text, which attnlab keeps for control"
        )
    eos = names[eos_id]
    order: list[int | None] = [None, None, eos_id, None] + sorted(set(vocab.values()) - {eos_id})
    new_id = {old: new for new, old in enumerate(order) if old is not None}
    model["vocab"] = {("<eos>" if token == eos else token): new_id[old] for token, old in vocab.items()}
    model["vocab"] |= {SPECIAL_TOKENS[i]: i for i in ADDED}
    model["unk_token"] = None if byte_level else SPECIAL_TOKENS[UNK]  # byte-level: every text is bytes it knows
    spec["added_tokens"] = [
        {
            "id": i,
            "content": SPECIAL_TOKENS[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in range(len(SPECIAL_TOKENS))
    ]
    return Vocabulary(library_tokenizer(spec, where), order, eos, "text", kind)


def library_tokenizer(spec: dict[str, Any], where: Path) -> Tokenizer:
    """The tokenizer of a tokenizer.json (as a dict), without padding or truncation."""
    spec["truncation"] = spec["padding"] = None
    try:
        return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)))
    except Exception as err:  # the library raises a plain Exception for a malformed file
        raise CheckpointError(f"{where}: not a tokenizer file the library reads ({err})") from None


def exported_vocabulary(cfg: DecoderLMConfig, run: RunDir) -> list[int]:
    """For each GPT-2 id of the export, the run's token id: a run imported from GPT-2 puts its tokens
    back at their original ids (init.json's order); the others keep their ids, less the control
    tokens that ``output.vocabulary: text`` never predicts."""
    vocab_size = run.read_shape().need("vocab_size", "a GPT-2 export")
    kept = [i for i in range(vocab_size) if cfg.output.vocabulary == "all" or i not in ADDED]
    order = run.read_init().get("order") if run.init.is_file() else None
    if isinstance(order, list) and len(order) == vocab_size and cfg.output.vocabulary == "text":
        original = {old: new for new, old in enumerate(order) if old is not None}
        if sorted(original) == list(range(len(kept))):
            return [original[old] for old in range(len(kept))]
    return kept
