"""CTranslate2, the C++ engine people deploy Marian / OPUS-MT and GPT-2-sized models with, as a
reference of the decoding benches (``pip install 'attnlab[ct2]'``).

CTranslate2 never sees a hand-written model: a transformers model (MarianMTModel, GPT2LMHeadModel)
is converted by CTranslate2's own ``TransformersConverter``, handed the model object itself (so the
weights are the very tensors transformers' column runs) and a :class:`Vocabulary`, the one part of
a tokenizer the converter reads (the benches' random-weight models have no tokenizer files). The
converted model is loaded once per compute type (attnlab's fp32 and int8: CTranslate2's 'float32'
and 'int8', quantised on loading) with ``intra_threads`` = torch's threads, the records say how many.
It is timed on the CPU only, the deployment these columns stand for; on a GPU they say so.

Marian's layout is not attnlab's, and CTranslate2's Marian loader assumes Marian's: its decoder
starts from a zero embedding (Marian's ``<pad>``) and it drops the vocabulary's last row (that
``<pad>``), where attnlab's Marian export and the benches' MarianMTModel put ``<pad>`` at 0 and start
from ``<bos>``. For timing this is the same work: the same shapes (V - 1 output rows of V), the same
number of steps. The tokens differ from the first step, so the benches check only that every row
has its fixed number of tokens; on a model in Marian's own layout CTranslate2's greedy tokens are
transformers' (tests/test_bench.py).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from attnlab.bench.reference import cpu_engine_missing

if TYPE_CHECKING:
    from transformers import PretrainedConfig

COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}  # attnlab's weights -> CTranslate2's compute type


class Vocabulary:
    """What CTranslate2's converter reads of a tokenizer: each token's id (``get_vocab``) and the
    control tokens' names, as attributes (``eos_token``, ``unk_token``, ...)."""

    def __init__(self, tokens: list[str], **control: str) -> None:
        self.tokens = tokens
        for role, token in control.items():
            setattr(self, role, token)

    def get_vocab(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    def names(self, ids: list[list[int]], leave_out: int | None = None) -> list[list[str]]:
        """Rows of token ids as the engine reads them: the tokens' names (``leave_out``: padding)."""
        return [[self.tokens[i] for i in row if i != leave_out] for row in ids]


def numbered(size: int, **control: int) -> Vocabulary:
    """A vocabulary of ``size`` tokens named by their ids ('<17>'), the ``control`` ones (role ->
    id, e.g. ``eos=2``) named as transformers names them ('</s>'), each also set as ``role_token``."""
    names = {"eos": "</s>", "unk": "<unk>", "bos": "<s>", "pad": "<pad>"}
    tokens = [f"<{i}>" for i in range(size)]
    for role, i in control.items():
        tokens[i] = names[role]
    return Vocabulary(tokens, **{f"{role}_token": names[role] for role in control})


def converted(model: torch.nn.Module, vocabulary: Vocabulary, out: Path) -> Path:
    """``model`` (a transformers model) as a CTranslate2 model folder under ``out``, written by
    CTranslate2's TransformersConverter from the model object itself."""
    from ctranslate2.converters import TransformersConverter

    class InMemory(TransformersConverter):
        """The converter, reading config.json from its folder and taking the model and tokenizer as given."""

        def load_model(self, model_class: type, model_name_or_path: str, **kwargs: Any) -> torch.nn.Module:
            return model

        def load_tokenizer(self, tokenizer_class: type, model_name_or_path: str, **kwargs: Any) -> Vocabulary:
            return vocabulary

    config = copy.copy(cast("PretrainedConfig", model.config))  # a transformers model's config
    config.dtype = next(model.parameters()).dtype  # the converter asks for it (else for the deprecated torch_dtype)
    config.save_pretrained(out / "transformers")
    return Path(InMemory(str(out / "transformers")).convert(str(out / "ctranslate2")))


def unavailable(device: torch.device) -> str | None:
    """Why CTranslate2's columns stay empty in a bench on ``device``, in one line (its extra is not
    installed, or the bench is not on the CPU); None where they run."""
    return cpu_engine_missing(device, "ct2", "ctranslate2", "transformers")


def engines(kind: str, model: torch.nn.Module, vocabulary: Vocabulary, weights: tuple[str, ...]) -> dict[str, Any]:
    """CTranslate2's ``kind`` ('Translator' or 'Generator') of ``model`` (on the CPU) for each of
    ``weights`` (fp32, int8), on the CPU with torch's thread count."""
    import ctranslate2

    ctranslate2.set_random_seed(0)  # the Generator's sampling, like torch's seeded generator
    with tempfile.TemporaryDirectory() as tmp:
        path = str(converted(model, vocabulary, Path(tmp)))
        return {
            w: getattr(ctranslate2, kind)(
                path,
                device="cpu",
                compute_type=COMPUTE_TYPES[w],
                intra_threads=torch.get_num_threads(),
                inter_threads=1,
            )
            for w in weights
        }


def reference_name(kind: str, weights: str) -> str:
    """How the records name the engine: 'ctranslate2.Translator (int8)'."""
    return f"ctranslate2.{kind} ({weights})"


def threads() -> dict[str, int]:
    """The field the CTranslate2 records carry: the threads both engines ran on."""
    return {"intra_threads": torch.get_num_threads()}
