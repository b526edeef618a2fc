"""Devices on the CPU-only machine (issue 18): which device a name and torchrun's LOCAL_RANK stand
for, `--device` on every command that runs a model, and checkpoints written whatever the storage
of the weights (cuDNN keeps a recurrent layer's weights as views of one flat buffer). What needs a
GPU is in tests/test_cuda.py."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors import safe_open
from test_reliability import workspace  # noqa: F401 (a fixture: a trained translation run)
from torch import nn

from attnlab.cli import main
from attnlab.device import resolve_device
from attnlab.errors import CheckpointError, ConfigError
from attnlab.runs.weights_file import load_weights, save_weights, write_checksums

from helpers import TORCHRUN, assert_only_torchruns_traceback, tiny_model

TORCHRUN_2 = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize(
    "name, env, gpus, device",
    [
        ("auto", {}, 0, "cpu"),
        ("auto", {}, 2, "cuda:0"),
        ("cpu", {}, 2, "cpu"),
        ("cuda", {}, 1, "cuda:0"),
        ("cuda:1", {}, 2, "cuda:1"),
        ("auto", TORCHRUN_2 | {"LOCAL_RANK": "1"}, 2, "cuda:1"),  # one GPU per local rank
        ("cuda", TORCHRUN_2 | {"LOCAL_RANK": "0"}, 2, "cuda:0"),
        ("auto", TORCHRUN_2 | {"LOCAL_RANK": "1"}, 0, "cpu"),  # gloo on the CPU
        ("cpu", TORCHRUN_2 | {"LOCAL_RANK": "1"}, 2, "cpu"),
        ("cuda", {"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, 1, "cuda:0"),  # one process: no torchrun mapping
    ],
)
def test_a_device_name_and_the_local_rank_give_the_device(name, env, gpus, device):
    assert resolve_device(name, env=env, n_gpus=gpus) == torch.device(device)


@pytest.mark.parametrize(
    "name, env, gpus, message",
    [
        ("cuda", {}, 0, "train.device is 'cuda' but no CUDA device is available"),
        ("cuda:2", {}, 2, "train.device is 'cuda:2' but this host has 2 GPU(s) (cuda:0 .. cuda:1)"),
        ("gpu", {}, 1, "train.device must be auto, cpu, cuda or cuda:N (got 'gpu')"),
        ("cuda:-1", {}, 1, "must be auto, cpu, cuda or cuda:N"),
        (
            "auto",
            TORCHRUN_2 | {"LOCAL_RANK": "1"},
            1,
            "torchrun started 2 processes on this host, which has 1 GPU(s): one GPU per process is needed (LOCAL_RANK 1); "
            "use --nproc_per_node 1",
        ),
        ("cuda:0", TORCHRUN_2 | {"LOCAL_RANK": "0"}, 2, "would put every rank on one GPU"),
    ],
)
def test_a_device_that_cannot_be_had_is_refused_in_one_line(name, env, gpus, message):
    with pytest.raises(ConfigError) as refused:
        resolve_device(name, env=env, n_gpus=gpus)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_torchrun_workers_refuse_a_device_they_cannot_have_in_one_line_each(tmp_path):
    """A worker prints the one-line refusal and exits; the only traceback is torchrun's own report of
    the failed workers. (tests/test_cuda.py runs the same with one GPU.)"""
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model: {stack: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}}\n"
        "data: {format: builtin, generator: {name: reverse}, n_train: 50, n_valid: 10, n_test: 10}\n"
        "train: {max_steps: 2, device: cuda, progress: false}\n"
    )
    done = subprocess.run(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "attnlab.cli",
            "train",
            str(config),
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and not (tmp_path / "run").exists()
    # the first worker to fail ends the job: torchrun stops the other, which may not have got as far
    assert done.stderr.count("error: train.device is 'cuda' but no CUDA device is available") in (1, 2)
    assert_only_torchruns_traceback(done.stderr)


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "{run}", "--input", "{root}/input.de", "--beam", "2"],
        ["evaluate", "{run}", "--split", "valid", "--json"],
        ["score", "{run}", "--src", "{root}/input.de", "--tgt", "{root}/input.de", "--json"],
        ["inspect", "{run}", "--split", "valid"],
        ["prune", "{run}", "--fraction", "0.5", "--json"],
    ],
    ids=lambda argv: argv[0],
)
def test_device_cpu_gives_what_the_default_gives(workspace, capsys, argv):  # noqa: F811
    """On a machine without a GPU, `--device auto` (the default) is the CPU: the same output."""
    outputs = []
    for extra in ([], ["--device", "cpu"]):
        assert main([a.format(run=workspace / "run", root=workspace) for a in argv] + extra) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0]
    if "--json" in argv and argv[0] == "score":
        assert json.loads(outputs[0])["tokens"] == 5  # "eins zwei" and "drei", each with EOS


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "{run}", "--input", "{root}/input.de", "--beam", "2", "--nbest", "2", "--min-len", "6"],
        ["translate", "{run}", "--input", "{root}/input.de", "--beam", "1", "--min-len", "6"],
    ],
    ids=["beam", "greedy"],
)
def test_every_kv_cache_gives_what_the_default_gives(workspace, capsys, argv):  # noqa: F811
    """--kv-cache static (preallocated buffers), dynamic and none (--no-cache): the same outputs and
    beam scores as auto, over at least 6 steps each (--min-len: the barely trained model would
    otherwise end at once, and the cache would never be read)."""
    outputs = []
    for extra in (["--kv-cache", "auto"], ["--kv-cache", "static"], ["--kv-cache", "dynamic"], ["--no-cache"]):
        assert main([a.format(run=workspace / "run", root=workspace) for a in argv] + extra) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]
    lines = [line.split(" ||| ")[1] if " ||| " in line else line for line in outputs[0].splitlines()]
    assert all(len(line.split()) >= 6 for line in lines)  # every output decoded over 6 steps or more


class FlatRNN(nn.Module):
    """A GRU whose weights are views of one flat buffer, as cuDNN lays them out on a GPU: no
    single weight covers the whole storage, which safetensors' own save_model refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 3, batch_first=True)
        self.out = nn.Linear(3, 5)
        self.out.weight = self.embed = nn.Parameter(torch.randn(5, 3))  # tied: one tensor, two names
        flat = torch.cat([p.detach().reshape(-1) for p in self.rnn.parameters()])
        offset = 0
        for p in self.rnn.parameters():
            p.data = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()


def test_weights_that_are_views_of_one_flat_buffer_save_and_reload(tmp_path):
    torch.manual_seed(0)
    model = FlatRNN()
    storages = {p.untyped_storage().data_ptr() for p in model.rnn.parameters()}
    assert len(storages) == 1  # the layout that made checkpoints fail on CUDA
    path = tmp_path / "model.safetensors"
    save_weights(model.state_dict(), path)
    write_checksums(tmp_path)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"out.weight": "embed"}  # the tied weight stored once, named as safetensors does
        assert len(list(f.keys())) == len(model.state_dict()) - 1
    torch.manual_seed(1)
    again = FlatRNN()  # other values, the same flat layout: loaded in place, into the views
    load_weights(again, path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    assert again.out.weight is again.embed
    x = torch.randn(2, 6, 4)
    assert torch.equal(model.out(model.rnn(x)[0]), again.out(again.rnn(x)[0]))
    assert {p.untyped_storage().data_ptr() for p in again.rnn.parameters()} == {
        again.rnn.weight_ih_l0.untyped_storage().data_ptr()
    }  # still one buffer


def test_a_file_saved_by_safetensors_save_model_still_loads(tmp_path):
    from safetensors.torch import save_model

    model = tiny_model(arch="decoder_lm", embeddings=dict(tie="output"))
    save_model(model, str(tmp_path / "model.safetensors"))  # how checkpoints were written before
    write_checksums(tmp_path)
    again = tiny_model(arch="decoder_lm", embeddings=dict(tie="output"))
    with torch.no_grad():
        for p in again.parameters():
            p.add_(1.0)  # other values, to be overwritten
    load_weights(again, tmp_path / "model.safetensors")
    for name, t in model.state_dict().items():
        assert torch.equal(t, again.state_dict()[name]), name


def test_a_failure_to_save_is_one_line(tmp_path):
    with pytest.raises(CheckpointError) as refused:
        save_weights(tiny_model().state_dict(), tmp_path / "missing" / "model.safetensors")
    assert "cannot save weights" in str(refused.value) and "\n" not in str(refused.value)


def test_weights_of_a_model_on_another_dtype_and_layout_are_stored_compact(tmp_path):
    """A transposed (non-contiguous) weight is stored as its values, row by row, not as its storage."""
    model = nn.Linear(3, 4)
    model.weight = nn.Parameter(torch.arange(12.0).reshape(3, 4).t())  # (4, 3) view of a (3, 4) buffer
    save_weights(model.state_dict(), tmp_path / "model.safetensors")
    write_checksums(tmp_path)
    again = nn.Linear(3, 4)
    load_weights(again, tmp_path / "model.safetensors")
    assert torch.equal(again.weight, model.weight) and again.weight.is_contiguous()
