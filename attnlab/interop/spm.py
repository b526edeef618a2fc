"""A SentencePiece model (Kudo and Richardson 2018) as a ``tokenizers`` unigram tokenizer over another
vocabulary's ids: Marian's source.spm and target.spm cut the text into pieces, and its vocab.json,
not the order of the pieces in the .spm, gives each piece its id.

The .spm file is read with the ``sentencepiece`` library's own protobuf description of it (nothing
in it is run): its pieces and their log-probabilities, its normalisation table (``nmt_nfkc``'s
precompiled character map) and its algorithm, which must be the unigram language model. The
tokenizer built here segments as ``transformers`` converts such a model (its ``SpmConverter``):
the character map, trailing spaces stripped, runs of spaces as one ``▁``, ``▁`` before each word,
then the most likely segmentation of each word. Every token of the vocabulary is a piece of the
unigram model at its own id. A token that is no piece of this .spm (the other side's pieces) is
kept under a name no text can match, ``FOREIGN`` before it, which decoding takes off again: the
.spm never cuts text into it, and characters it does not know become one <unk> per run of them,
as SentencePiece's do.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, cast

import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

from attnlab.data.tokenizers import SPECIAL_TOKENS, UNK, Tokenizer
from attnlab.errors import CheckpointError

UNIGRAM = 1  # ModelProto.TrainerSpec.model_type
NEVER = -1e9  # the log-probability of a token that is no piece of the .spm (as data/tokenizers.py gives control tokens)
FOREIGN = "\ufffe"  # a noncharacter, in no text: marks the vocabulary's tokens that are no piece of this .spm


def read_spm(path: Path) -> Any:  # a ModelProto
    """The .spm's description, or one line naming the file."""
    # protobuf's generated module makes its message classes when imported: mypy sees none of them
    proto = cast(Any, sentencepiece_model_pb2).ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as err:  # protobuf raises its own DecodeError, or a plain one for a short file
        raise CheckpointError(f"{path}: not a SentencePiece model ({err})") from None
    if not proto.pieces:
        raise CheckpointError(f"{path}: a SentencePiece model with no pieces")
    if proto.trainer_spec.model_type != UNIGRAM:
        raise CheckpointError(
            f"{path}: a SentencePiece model of type {proto.trainer_spec.model_type}; attnlab reads "
            f"unigram models (type {UNIGRAM}), as Marian's are"
        )
    return proto


def spm_tokenizer(path: Path, vocabulary: list[str], added: list[str]) -> Tokenizer:
    """The .spm at ``path`` segmenting text into the tokens of ``vocabulary`` (token id -> token, with
    attnlab's four control tokens at ids 0-3); ``added``: tokens matched whole wherever they appear
    in the text (Marian's language codes, ``>>de<<``)."""
    proto = read_spm(path)
    scores = {p.piece: p.score for p in proto.pieces if p.type == 1}  # NORMAL pieces: what text is cut into
    control = set(SPECIAL_TOKENS)
    pieces = [
        (token, NEVER) if token in control else (token, scores[token]) if token in scores else (FOREIGN + token, NEVER)
        for token in vocabulary
    ]
    hf = tokenizers.Tokenizer(models.Unigram(pieces, unk_id=UNK, byte_fallback=False))
    charsmap = proto.normalizer_spec.precompiled_charsmap
    steps = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "▁")]
    hf.normalizer = normalizers.Sequence(([normalizers.Precompiled(charsmap)] if charsmap else []) + steps)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    hf.decoder = decoders.Sequence(
        [decoders.Replace(FOREIGN, ""), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    hf.add_special_tokens(SPECIAL_TOKENS)
    if added:
        hf.add_tokens([tokenizers.AddedToken(token, normalized=False) for token in added])
    return Tokenizer(hf)


def spm_model(tokenizer: Tokenizer, names: dict[str, str]) -> bytes:
    """A unigram tokenizer written by :func:`spm_tokenizer` (or trained by attnlab, data/tokenizers.py)
    as a .spm file: its own pieces with their log-probabilities, <unk> (and ``names``' control
    tokens, attnlab's name -> the file's) as SentencePiece's special pieces, and its character map."""
    spec = json.loads(tokenizer.to_str())
    proto = cast(Any, sentencepiece_model_pb2).ModelProto()  # made at import, unseen by mypy (read_spm)
    proto.trainer_spec.model_type = UNIGRAM
    kinds = cast(Any, sentencepiece_model_pb2).ModelProto.SentencePiece
    for token, score in spec["model"]["vocab"]:
        if token == SPECIAL_TOKENS[UNK]:
            proto.trainer_spec.unk_id = len(proto.pieces)
            proto.pieces.add(piece=names.get(token, token), score=0.0, type=kinds.UNKNOWN)
        elif token in names:
            proto.pieces.add(piece=names[token], score=0.0, type=kinds.CONTROL)
        elif not token.startswith(FOREIGN) and token not in SPECIAL_TOKENS:
            proto.pieces.add(piece=token, score=score, type=kinds.NORMAL)
    steps = (spec.get("normalizer") or {}).get("normalizers", [])
    charsmap = next((step["precompiled_charsmap"] for step in steps if step["type"] == "Precompiled"), None)
    proto.normalizer_spec.name = "nmt_nfkc" if charsmap else "identity"
    if charsmap:
        proto.normalizer_spec.precompiled_charsmap = base64.b64decode(charsmap)
    proto.normalizer_spec.add_dummy_prefix = proto.normalizer_spec.remove_extra_whitespaces = True
    proto.normalizer_spec.escape_whitespaces = True
    return proto.SerializeToString()
