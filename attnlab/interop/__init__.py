"""Hugging Face model folders in and out: `attnlab import-hf` and `attnlab export-hf`. folder.py holds
what every architecture shares and the converters by ``model_type``; each architecture is one module
that registers its converter (bert.py: BERT <-> encoder_only; gpt2.py: GPT-2 <-> decoder_lm;
marian.py: Marian <-> encoder_decoder; vit.py: ViT <-> vit; whisper.py: Whisper <-> whisper; ast.py: AST
<-> ast), beside it its weights' names (ast_weights.py, bert_weights.py, marian_weights.py, vit_weights.py,
whisper_weights.py) or GPT-2's vocabulary (gpt2_vocabulary.py)."""

from attnlab.interop import ast, bert, gpt2, marian, vit, whisper  # noqa: F401  (each registers its converter)
from attnlab.interop.bert import bert_model_fields
from attnlab.interop.bert_weights import load_bert
from attnlab.interop.folder import CONVERTERS, EXPORTERS, export_hf, import_hf

__all__ = ["CONVERTERS", "EXPORTERS", "bert_model_fields", "export_hf", "import_hf", "load_bert"]
