"""ONNX Runtime, the engine people deploy exported encoders with, as a reference of ``bench encoder``
(``pip install 'attnlab[ort]'``).

ONNX Runtime runs the very BertModel of the bench's transformers column, exported by
``torch.onnx.export`` with the dynamo exporter (the default and the maintained path: the graph of
``torch.export``, translated by onnxscript into an ONNX model; the TorchScript exporter is
deprecated), for the bench's inputs, so their shapes are fixed, into a temporary folder. The
session runs on the CPU with ONNX Runtime's default graph optimisations and ``intra_op_num_threads``
= torch's threads (one inter-op thread); the records say how many. fp32 only, the model's own type.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from attnlab.bench.reference import cpu_engine_missing

REFERENCE = "onnxruntime.InferenceSession (fp32)"
OUTPUTS = ["last_hidden_state", "pooler_output"]  # BertModel's, in its order


def exported(model: torch.nn.Module, inputs: dict[str, Tensor], out: Path) -> Path:
    """``model`` (a transformers BertModel, on the CPU) as an ONNX file under ``out``, called with
    ``inputs`` (keyword -> (B, T) ids), its outputs named as the model names them."""
    path = out / "model.onnx"
    torch.onnx.export(
        model, (), path, kwargs=inputs, dynamo=True, output_names=OUTPUTS, verbose=False
    )  # no progress lines on stdout, where the records go
    return path


def last_hidden_state(model: torch.nn.Module, inputs: dict[str, Tensor]) -> Callable[[], Tensor]:
    """``model`` exported and loaded into ONNX Runtime: a call that runs it on ``inputs`` and returns
    its last hidden state (B, T, D), on torch's threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    with tempfile.TemporaryDirectory() as tmp:  # the session has read the model (and its weights' file) when built
        session = onnxruntime.InferenceSession(
            str(exported(model, inputs, Path(tmp))), options, providers=["CPUExecutionProvider"]
        )
    feed = {name: ids.numpy() for name, ids in inputs.items()}
    return lambda: torch.from_numpy(session.run(OUTPUTS[:1], feed)[0])


def unavailable(device: torch.device) -> str | None:
    """Why ONNX Runtime's columns stay empty in a bench on ``device``, in one line; None where they run."""
    return cpu_engine_missing(device, "ort", "onnxruntime", "onnx", "onnxscript")


def threads() -> dict[str, int]:
    """The field ONNX Runtime's records carry: the threads both ran on."""
    return {"intra_op_num_threads": torch.get_num_threads()}
