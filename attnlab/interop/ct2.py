"""CTranslate2 models of runs (`attnlab export-ct2`), for deploying a run with the C++ engine people
serve Marian / OPUS-MT and GPT-2-sized models with (``pip install 'attnlab[ct2]'``).

A run is never written out layer by layer here: it goes through attnlab's own Hugging Face export
(folder.py: a decoder_lm run as GPT-2, an encoder_decoder run as Marian), and CTranslate2's own
``TransformersConverter`` reads that folder, with CTranslate2's loader of the architecture:

    decoder_lm       -> GPT2LMHeadModel -> GPT2Loader           -> ctranslate2.Generator
    encoder_decoder  -> MarianMTModel   -> RunLayoutMarianLoader -> ctranslate2.Translator

so a run CTranslate2 deploys is a run its Hugging Face export takes, and the options that export
refuses (a positional scheme GPT-2 or Marian lacks, pre-norm in Marian, pruned heads, ...) are
refused here, named in one line. Other families (encoder_only, vit, ...) are refused too.

CTranslate2's Marian loader assumes Marian's own layout: the decoder starts from a zero embedding
(``start_from_zero_embedding``) and the vocabulary's last row, Marian's ``<pad>``, is dropped from
the embedding and the output projection. attnlab's Marian export keeps every row (``<pad>`` at 0)
and starts from the embedding of ``decoder_start_token_id`` (``<bos>`` for a run trained by
attnlab), as transformers' MarianMTModel does. :class:`RunLayoutMarianLoader` is CTranslate2's
loader with those two assumptions turned off: the decoder starts from the start token's row and
every row is kept (a run imported from Marian, exported at Marian's ids, starts from its <pad> row,
as transformers does). attnlab's decoding never outputs <pad> or <bos> (their log-probability is
-inf); the converted output projection gets a bias of -inf at those rows (:func:`never_predicted`),
so CTranslate2 never outputs them either. The result decodes as the run does: given the run's source tokens (ending
with ``</s>``), ``translate_batch(..., beam_size=1, min_decoding_length=0)`` gives attnlab's greedy
tokens (CTranslate2's default minimum, 1, never gives an empty translation; tests/test_ct2_export.py).
"""

from __future__ import annotations

import importlib.util
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from attnlab.data.tokenizers import BOS, PAD, SPECIAL_TOKENS
from attnlab.errors import ConfigError, UsageError
from attnlab.files import publish_dir, staging_dir
from attnlab.interop.folder import EXPORTERS, export_hf
from attnlab.models import FamilyConfig
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import TaskConfig

ENGINES = {"decoder_lm": "Generator", "encoder_decoder": "Translator"}  # arch -> the ctranslate2 class running it
NEVER_PREDICTED = (SPECIAL_TOKENS[PAD], SPECIAL_TOKENS[BOS])  # decoding rules them out (decode/session.py)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")  # CTranslate2's stored types


def missing_extra() -> str | None:
    """Why CTranslate2's export cannot run here, in one line; None where it can."""
    absent = [name for name in ("ctranslate2", "transformers") if importlib.util.find_spec(name) is None]
    return f"the ct2 extra is not installed (no {', '.join(absent)}): pip install 'attnlab[ct2]'" if absent else None


def export_refusals(cfg: FamilyConfig, data: TaskConfig, run: RunDir | None = None) -> list[str]:
    """Why CTranslate2 cannot deploy the run (``run`` None: a config's run, once trained), each part
    one phrase ([] when it can)."""
    if cfg.arch not in ENGINES:
        have = ", ".join(
            f"'{arch}' (as {EXPORTERS[arch].described}, ctranslate2.{engine})" for arch, engine in ENGINES.items()
        )
        return [f"arch '{cfg.arch}' has no CTranslate2 export (it deploys arch {have})"]
    converter = EXPORTERS[cfg.arch]
    refused = converter.export_refusals(cfg, data, run)
    if not refused:
        return []
    return [f"CTranslate2 deploys it as {converter.described}, which has no counterpart for {'; '.join(refused)}"]


def export_ct2(
    run_dir: str | Path, out: str | Path, checkpoint: str = "best", quantization: str | None = None
) -> tuple[str, Path]:
    """Write the CTranslate2 model folder ``out`` (which must not exist, or be empty) of a run's
    checkpoint, its weights stored as ``quantization`` (CTranslate2's name; None: as they are):
    the ctranslate2 class that runs it ('Generator' or 'Translator') and ``out``."""
    out = Path(out)
    if quantization not in (None, *QUANTIZATIONS):
        raise UsageError(f"--quantization {quantization!r}: CTranslate2 stores {', '.join(QUANTIZATIONS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty; choose another --out")
    run = RunDir(run_dir)
    cfg, data, _ = run.read_config()
    refused = export_refusals(cfg, data, run)
    if refused:
        raise ConfigError(f"{run.path}: {'; '.join(refused)}")
    missing = missing_extra()
    if missing:
        raise UsageError(f"export-ct2: {missing}")
    staged = staging_dir(out)
    with tempfile.TemporaryDirectory() as tmp:
        _, folder = export_hf(run.path, Path(tmp) / "hf", checkpoint)
        # force: the converter writes into an empty folder of its own, and the staged one is that
        run_converter(folder).convert(str(staged), quantization=quantization, force=True)
    publish_dir(staged, out)
    return ENGINES[cfg.arch], out


def never_predicted(projection: Any, tokens: list[str]) -> None:
    """Give the output projection (CTranslate2's LinearSpec; ``tokens``: its rows' names) a bias of
    -inf at :data:`NEVER_PREDICTED`, so that CTranslate2, like attnlab, never outputs them."""
    bias = projection.bias.detach().clone() if projection.has_bias() else torch.zeros(len(tokens))
    bias[[i for i, token in enumerate(tokens) if token in NEVER_PREDICTED]] = -torch.inf
    projection.bias = bias


@contextmanager
def quiet(transformers: Any) -> Iterator[None]:
    """transformers without its loading bar, and MarianTokenizer without its advice to install
    sacremoses (it normalises text the converter never passes)."""
    bar = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
            yield
    finally:
        if bar:
            transformers.utils.logging.enable_progress_bar()


def run_converter(folder: Path) -> Any:
    """CTranslate2's TransformersConverter of ``folder``, a Hugging Face folder :func:`export_hf`
    wrote, with Marian's loader in the run's layout (imported here: ctranslate2 is an optional extra)."""
    import transformers
    from ctranslate2.converters import transformers as ct2

    class RunLayoutMarianLoader(ct2.MarianMTLoader):
        """CTranslate2's Marian loader for attnlab's Marian export: the decoder starts from the
        embedding of ``decoder_start_token_id``, and no vocabulary row is dropped."""

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            super().set_config(config, model, tokenizer)
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            ct2.BartLoader.set_decoder(self, spec, decoder)  # Marian's loader: the same, from a zero embedding

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            return ct2.BartLoader.get_vocabulary(self, model, tokenizer)  # Marian's: the same, less a last <pad>

        def _remove_pad_weights(self, spec: Any) -> None:
            """Every row kept: the run's <pad> is a row like any other, not one Marian appended."""

    loaders = {"gpt2": ct2.GPT2Loader, "marian": RunLayoutMarianLoader}  # model_type -> CTranslate2's loader

    class Converter(ct2.TransformersConverter):
        """The converter's one hook: the model, its tokenizer and the loader that makes the spec of them."""

        def _load(self) -> Any:
            path = self._model_name_or_path
            loader = loaders[transformers.AutoConfig.from_pretrained(path).model_type]()
            with quiet(transformers):
                model = getattr(transformers, loader.architecture_name).from_pretrained(path).eval()
                tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            spec = loader(model, tokenizer)
            never_predicted(spec.decoder.projection, loader.get_vocabulary(model, tokenizer))
            return spec

    return Converter(str(folder))
