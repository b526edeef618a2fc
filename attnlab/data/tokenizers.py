"""Tokenizers: text <-> ids, all built on the Hugging Face ``tokenizers`` library.

Seven kinds behind one interface, each saved as the library's own ``tokenizer.json``:

- ``char``: every Unicode character is a token (NFC-normalised), spaces and newlines included;
- ``word``: whitespace-separated words; decoding joins them with single spaces;
- ``word_nopunct``: the words alone, every run of punctuation read as a space (as VQA's question
  preprocessing drops it, Antol et al. 2015), so "triangle?" and "triangle" are the same word; decoding
  joins them with single spaces;
- ``bpe``: byte-pair encoding (Sennrich et al. 2016) over SentencePiece-style ``▁`` word starts,
  with byte fallback, so that any text round-trips, unseen characters included;
- ``byte_bpe``: GPT-2's byte-level BPE (Radford et al. 2019): the text's UTF-8 bytes as 256 base
  symbols, split before merging as GPT-2's regular expression splits words, a word's leading space
  part of it; any text round-trips, and nothing is unknown;
- ``unigram``: the unigram language model (Kudo 2018) over the same word starts;
- ``wordpiece``: BERT's subwords (Wu et al. 2016), continuation pieces marked ``##``, over words
  and punctuation (BERT's pre-tokenizer), lower-cased as uncased BERT is.

The special tokens have the same ids in every tokenizer: PAD 0, BOS 1, EOS 2, UNK 3; a tokenizer
for masked-LM training also has ``<mask>`` at id 4 (``with_mask``). They are control symbols, never text: ``<eos>`` or ``<pad>`` typed in the input is encoded as the characters
or subwords it is made of (``char``, ``bpe``, ``unigram``) or as an unknown word (``word``), so a
user's text can never end a sentence early or be read as padding.
A character or word never seen in training becomes UNK (``char``, ``word``, ``unigram``).
Subword decoding drops leading whitespace (a ``▁`` artefact); text without it round-trips exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.errors import DataError

PAD, BOS, EOS, UNK = 0, 1, 2, 3
CONTROL_IDS = frozenset((PAD, BOS, EOS))  # ids that steer decoding; text never encodes to them
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
MASK_TOKEN, MASK = "<mask>", 4  # only in tokenizers trained with_mask (the masked-LM task)
TOKENIZER_KINDS = ("char", "word", "word_nopunct", "bpe", "byte_bpe", "unigram", "wordpiece")
WORD_LEVEL = {
    "word": normalizers.NFC(),  # the word-level kinds: what each reads before splitting at whitespace
    "word_nopunct": normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"[^\w\s]+"), " ")]),
}
_BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]


def _pipeline(kind: str, vocab_size: int, specials: list[str]) -> tuple[tokenizers.Tokenizer, trainers.Trainer]:
    """An untrained tokenizer of the given kind and the trainer that fits it, ``specials`` first."""
    if kind == "char":
        tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
        tok.decoder = decoders.Fuse()
        return tok, trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1)
    if kind in WORD_LEVEL:
        tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
        tok.normalizer = WORD_LEVEL[kind]
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok, trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1)
    if kind == "bpe":
        tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        return tok, trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials + _BYTE_TOKENS, show_progress=False
        )
    if kind == "byte_bpe":
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok, trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    if kind == "wordpiece":
        tok = tokenizers.Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        return tok, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return tok, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
    )


class Tokenizer:
    """Text <-> token ids. Build with :meth:`train` or :meth:`load`."""

    def __init__(self, hf: tokenizers.Tokenizer) -> None:
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if hf.token_to_id(token) != token_id:
                raise DataError(f"tokenizer has {token} at id {hf.token_to_id(token)}, expected {token_id}")
        hf.encode_special_tokens = True  # '<eos>' typed in the text is text, never the EOS id
        self.hf = hf
        self.has_mask = hf.token_to_id(MASK_TOKEN) == MASK
        self.controls = CONTROL_IDS | ({MASK} if self.has_mask else set())  # ids text never encodes to

    @classmethod
    def train(cls, kind: str, texts: Iterable[str], vocab_size: int = 8000, with_mask: bool = False) -> "Tokenizer":
        """Fit a tokenizer of ``kind`` on ``texts``; ``vocab_size`` bounds the subword kinds only;
        ``with_mask``: also ``<mask>``, at id 4."""
        specials = SPECIAL_TOKENS + [MASK_TOKEN] * with_mask
        hf, trainer = _pipeline(kind, vocab_size, specials)
        try:
            hf.train_from_iterator(texts, trainer)
        except Exception as err:  # the library raises a plain Exception, e.g. for a vocabulary too small
            raise DataError(
                f"cannot train the {kind} tokenizer: {err} (data.text.vocab_size is {vocab_size})"
            ) from None
        for token_id, token in enumerate(specials):
            if hf.token_to_id(token) != token_id:
                raise DataError(
                    f"the training text uses the special token {token} as a word; the {kind} "
                    f"tokenizer reserves it (id {token_id}): rename it in the data or use another tokenizer"
                )
        return cls(_specials_unreachable(hf, len(specials)) if kind == "unigram" else hf)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._as_text(self.hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self._as_text(e.ids) for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def word_starts(self, text: str) -> list[bool]:
        """For each token of ``text``, whether it begins a word (whole-word masking): where the
        pre-tokenizer's word changes, so every token of ``char``, ``word`` and ``word_nopunct``, and the first piece of
        each space-separated word for ``bpe`` and ``unigram``."""
        encoding = self.hf.encode(text, add_special_tokens=False)
        words = encoding.word_ids
        return [i == 0 or words[i] != words[i - 1] or words[i] is None for i in range(len(words))]

    def _as_text(self, ids: list[int]) -> list[int]:
        """A control id that came out of text is an unknown word: the word-level model looks
        ``<pad>`` up in its vocabulary, where the trainer put the special tokens (and a unigram
        tokenizer saved before :func:`_specials_unreachable` may pick them as pieces)."""
        return [UNK if i in self.controls else i for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS, without PAD and BOS; UNK shows as ``<unk>``."""
        kept = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                kept.append(int(i))
        return self.hf.decode(kept, skip_special_tokens=False)

    def tokens(self, text: str) -> list[str]:
        return self.hf.encode(text, add_special_tokens=False).tokens

    def id_tokens(self, ids: Iterable[int]) -> list[str]:
        """The token string of each id, special tokens included (labels for attention plots)."""
        return [self.hf.id_to_token(int(i)) or "" for i in ids]

    def to_str(self) -> str:
        return self.hf.to_str()

    @classmethod
    def from_str(cls, text: str) -> "Tokenizer":
        return cls(tokenizers.Tokenizer.from_str(text))

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: cannot read tokenizer file ({err})") from None
        try:
            hf = tokenizers.Tokenizer.from_str(text)
        except Exception as err:  # the library raises a plain Exception for malformed files
            raise DataError(f"{path}: not a tokenizer file ({err})") from None
        return cls(hf)


def _specials_unreachable(hf: tokenizers.Tokenizer, n_specials: int) -> tokenizers.Tokenizer:
    """The unigram trainer gives the special pieces log-probability 0, the highest there is, so
    the segmentation of ``<eos>`` in a text would pick the piece. Give them a score no segmentation
    chooses: typed, they are segmented as the text they are."""
    spec = json.loads(hf.to_str())
    for entry in spec["model"]["vocab"][:n_specials]:
        entry[1] = -1e9
    return tokenizers.Tokenizer.from_str(json.dumps(spec))
