"""Decoding weights (decode/weights.py): int8 linear layers hold each output channel as int8 with
the symmetric per-channel scale max|w| / 127.5 and compute what the float layer computes within
that rounding; bf16 converts every floating tensor; the searches run on both and their
log-probabilities stay close to fp32's; int8 is refused off the CPU.

Exported runs (`attnlab export`, runs/derived.py export_run): the file holds int8 values and
float32 scales (or bf16 tensors), tied weights come out right, the loaded run computes exactly what
its source run computes with those weights (logits, beam search, greedy), the checksums cover it,
and bad input is one line."""

from __future__ import annotations

import copy
import json
import re

import pytest
import test_reliability
import torch
from safetensors import safe_open
from test_bench import lm_run
from test_reliability import CHECKPOINT, USAGE, flip_byte, snapshot
from torch import nn

from attnlab.cli import main
from attnlab.decode.search import beam_search, greedy
from attnlab.decode.session import DecodingSession
from attnlab.decode.spec import Sample, sample
from attnlab.decode.weights import Int8VocabularyProjection, weights_of, with_weights
from attnlab.errors import CheckpointError, UsageError
from attnlab.nn.heads import VocabularyProjection
from attnlab.runs.checkpoint import load_run
from attnlab.runs.derived import export_run, write_average
from attnlab.runs.run_dir import RunDir
from attnlab.runs.weights_file import WEIGHTS_KEY

from helpers import random_ids, run_cli, tiny_model

workspace = test_reliability.workspace  # a fixture: a corpus, its config and a trained translation run


def quantized_linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "Linear" and hasattr(m, "_packed_params")]


def test_int8_weights_are_per_channel_symmetric_int8_of_every_linear_layer_the_output_projection_included():
    model = tiny_model(arch="encoder_decoder")
    floats = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    quantized = with_weights(copy.deepcopy(model), "int8")
    linears = dict((name, m) for name, m in quantized.named_modules() if m in quantized_linears(quantized))
    floats["generator.linear"] = floats.pop("generator")  # the int8 projection holds its int8 layer as .linear
    assert set(linears) == set(floats) and len(linears) > 10
    assert type(quantized.generator) is Int8VocabularyProjection
    assert quantized.generator.vocab_size == model.generator.vocab_size
    assert quantized.tgt_embed.tokens.weight.dtype == torch.float32  # the tied table stays float32 ...
    assert torch.equal(quantized.tgt_embed.tokens.weight, floats["generator.linear"])  # ... and unchanged
    for name, module in linears.items():
        w = module.weight()  # the int8 tensor with its scales
        assert w.dtype == torch.qint8 and w.qscheme() == torch.per_channel_affine
        assert (w.q_per_channel_zero_points() == 0).all()  # symmetric: stored as affine about 0
        amax = floats[name].abs().amax(dim=1)  # (out,) one scale per output channel
        torch.testing.assert_close(w.q_per_channel_scales().float(), amax / 127.5, rtol=1e-5, atol=1e-12)
        error = (w.dequantize() - floats[name]).abs()
        assert (error <= w.q_per_channel_scales().float()[:, None] / 2 + 1e-7).all()


def test_the_int8_output_projection_cuts_its_padding_rows_and_keeps_never_output_tokens_at_minus_infinity():
    torch.manual_seed(0)
    projection = VocabularyProjection(16, rows=64, vocab_size=50, never=(0, 1), bias=True)
    nn.init.normal_(projection.bias)
    int8 = Int8VocabularyProjection.of(projection)
    h = torch.randn(3, 5, 16)  # (B, T, d_model)
    with torch.no_grad():
        exact, close = projection(h), int8(h)  # (B, T, 50)
    assert close.shape == exact.shape == (3, 5, 50)
    assert close[..., :2].eq(-torch.inf).all() and close[..., 2:].isfinite().all()
    # each weight is within half its row's scale (max|row| / 255), each input within half the input's
    # scale (at most max|h| / 127, one per tensor: fbgemm keeps 7 bits of range), so
    # |error| <= sum_i |h_i| |dw_i| + |dh_i| |w_i| + |dh_i| |dw_i|
    w, scale_w, scale_h = projection.weight[:50], projection.weight[:50].abs().amax(1) / 255, h.abs().max() / 127
    bound = h.abs() @ scale_w[None].expand(16, 50) + scale_h * w.abs().sum(1) + 16 * scale_h * scale_w  # (B, T, 50)
    assert ((close - exact).abs()[..., 2:] <= bound[..., 2:] + 1e-5).all()
    assert (close - exact)[..., 2:].abs().max() > 0  # int8, not a float copy


# measured on this model: int8 max 0.093, mean 0.020 (0.018 with the output projection in float32); bf16 max 0.024 (0.029 without native bf16), mean 0.006 (nats)
@pytest.mark.parametrize("weights, largest, mean", [("int8", 0.15, 0.03), ("bf16", 0.05, 0.01)])
def test_decoding_with_lower_precision_weights_stays_close_to_fp32(weights, largest, mean):
    model = tiny_model(arch="encoder_decoder")
    lower = with_weights(copy.deepcopy(model), weights)
    src, tgt = random_ids(4, 9), random_ids(4, 6, generator_seed=1)
    exact = DecodingSession(model, src=src, kv_cache="dynamic").score(tgt)
    close = DecodingSession(lower, src=src, kv_cache="dynamic").score(tgt)
    finite = exact.isfinite()
    assert close.dtype == torch.float32 and (close.isfinite() == finite).all()
    difference = (close[finite] - exact[finite]).abs()
    assert difference.max() < largest and difference.mean() < mean
    assert len(greedy(lower, src)) == 4
    if weights == "bf16":
        assert {p.dtype for p in lower.parameters()} == {torch.bfloat16}


def test_int8_is_refused_off_the_cpu_and_unknown_weights_too():
    model = tiny_model(arch="decoder_lm").to("meta")
    with pytest.raises(ValueError, match="int8 weights run on the CPU's kernels, and this model is on 'meta'"):
        with_weights(model, "int8")
    with pytest.raises(ValueError, match="weights must be one of fp32, bf16, int8"):
        with_weights(model, "fp16")


def test_converted_weights_stay_as_they_are_and_tell_their_kind():
    model = tiny_model(arch="decoder_lm")
    assert weights_of(model) == "fp32"
    lower = with_weights(model, "bf16")
    assert weights_of(lower) == "bf16" and with_weights(lower, "bf16") is lower
    with pytest.raises(ValueError, match="the model's weights are bf16 already .* do not become int8"):
        with_weights(lower, "int8")
    assert weights_of(with_weights(tiny_model(arch="decoder_lm"), "int8")) == "int8"


# -- exported runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(workspace, tmp_path_factory):
    """Two trained runs whose embeddings are tied to the output projection: a translation model
    (source, target and output: one tensor) and a character LM."""
    return {"translation": workspace / "run", "lm": lm_run(tmp_path_factory.mktemp("lm"), "lm")}


def test_an_int8_export_holds_int8_weights_with_float32_scales_and_the_rest_in_float32(runs, tmp_path):
    exported, source = export_run(runs["translation"], tmp_path / "int8", "int8")
    model = load_run(runs["translation"])[0]
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    linears["generator.linear"] = linears.pop("generator")  # the output projection's int8 layer
    assert model.generator.weight is model.src_embed.tokens.weight is model.tgt_embed.tokens.weight
    with safe_open(str(exported), "pt") as f:
        metadata, stored = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    assert metadata[WEIGHTS_KEY] == "int8" and "per output channel" in metadata["attnlab.layout"]
    for name, linear in linears.items():  # (out, in) int8, one float32 scale per output channel
        assert stored[f"{name}.weight"].dtype == torch.int8 and stored[f"{name}.weight"].shape == linear.weight.shape
        assert stored[f"{name}.weight_scale"].dtype == torch.float32
        assert stored[f"{name}.weight_scale"].shape == (linear.out_features,)
    quantised = {f"{name}.{part}" for name in linears for part in ("weight", "weight_scale")}
    assert {stored[name].dtype for name in set(stored) - quantised} == {torch.float32}  # embeddings, norms, biases
    # the embedding tables, one tensor, stored once in float32; the output projection as its int8 copy
    assert metadata["tgt_embed.tokens.weight"] == "src_embed.tokens.weight" and "tgt_embed.tokens.weight" not in stored
    assert "generator.weight" not in stored and "generator.weight" not in metadata
    assert torch.equal(stored["src_embed.tokens.weight"], model.src_embed.tokens.weight)
    assert exported.stat().st_size < source.stat().st_size
    assert set(json.loads((exported.parent / "checksums.json").read_text())) == {"model.safetensors", "meta.json"}


@pytest.mark.parametrize("weights", ["int8", "bf16"])
@pytest.mark.parametrize("task", ["translation", "lm"])
def test_an_exported_run_computes_exactly_what_its_run_computes_with_those_weights(runs, tmp_path, task, weights):
    export_run(runs[task], tmp_path / "export", weights)
    exported = load_run(tmp_path / "export")[0]
    vocab = RunDir(tmp_path / "export").read_shape().need("vocab_size")
    source = load_run(runs[task])[0]
    assert source.generator.weight is (source.tgt_embed if task == "translation" else source.embed).tokens.weight
    converted = with_weights(source, weights)
    assert weights_of(exported) == weights
    ids = random_ids(3, 7, vocab=vocab)  # (B, T)
    with torch.no_grad():
        if task == "translation":
            src = random_ids(3, 5, vocab=vocab, generator_seed=1)  # (B, S)
            assert torch.equal(exported(src, ids), converted(src, ids))  # (B, T, V) logits, bit for bit
            assert beam_search(exported, src, beam=3, min_len=4) == beam_search(converted, src, beam=3, min_len=4)
            assert greedy(exported, src, min_len=4) == greedy(converted, src, min_len=4)
        else:
            assert torch.equal(exported(ids), converted(ids))
            greedily = Sample(max_len=12, top_k=1, stop_at_eos=False)
            assert sample(exported, greedily, prompt=ids[:, :3]) == sample(converted, greedily, prompt=ids[:, :3])
    if weights == "bf16":
        assert {p.dtype for p in exported.parameters()} == {torch.bfloat16}


def test_attnlab_export_writes_a_run_that_translate_reads_as_its_run_with_those_weights(runs, tmp_path):
    run, out = runs["translation"], tmp_path / "int8"
    done = run_cli("export", str(run), "--weights", "int8", "--out", str(out), "--checkpoint", "last")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"exported \S+ with int8 weights to \S+: [\d.]+ MiB, 0\.\d\d x the checkpoint's [\d.]+ MiB\n"
        rf"run directory: {out}\n",
        done.stdout,
    )
    (tmp_path / "in.de").write_text("eins zwei drei\nvier\n")
    translate = ["translate", "--input", str(tmp_path / "in.de"), "--beam", "2", "--min-len", "2"]
    mine = run_cli(*translate, str(out))
    assert (
        mine.returncode == 0
        and mine.stdout == run_cli(*translate, str(run), "--checkpoint", "last", "--weights", "int8").stdout
    )
    assert run_cli(*translate, str(out), "--weights", "int8").stdout == mine.stdout  # its own weights: as given
    refused = run_cli(*translate, str(out), "--weights", "fp32")
    assert refused.returncode == USAGE and refused.stderr == (
        "error: --weights fp32: the model's weights are int8 already (a run exported with them), and do not become "
        "fp32; leave --weights out\n"
    )


def test_the_checksums_cover_an_exported_file(runs, tmp_path):
    exported, _ = export_run(runs["lm"], tmp_path / "bf16", "bf16")
    flip_byte(exported)
    with pytest.raises(CheckpointError, match="differs from the recorded"):
        load_run(tmp_path / "bf16")


def test_int8_weights_are_refused_where_they_cannot_run_and_an_export_is_not_trained_or_averaged(runs, tmp_path):
    export_run(runs["lm"], tmp_path / "int8", "int8")
    with pytest.raises(
        UsageError,
        match=r"int8: its int8 weights cannot run here \(int8 weights run on the CPU's "
        r"kernels, and this model is on 'meta'",
    ):
        load_run(tmp_path / "int8", device="meta")  # as on CUDA: no int8 kernels there
    with pytest.raises(CheckpointError, match="holds int8 weights, exported for decoding, where fp32 ones are needed"):
        write_average(tmp_path / "int8", 1)


EXPORT = ["export", "{root}/run", "--weights", "int8", "--out"]
BAD_EXPORTS = [
    ("--out exists", EXPORT + ["{root}/out.txt"], USAGE, "{root}/out.txt already exists; pass --force to replace it"),
    ("--out is the run itself", EXPORT + ["{root}/run", "--force"], USAGE, "holds the run {root}/run itself"),
    (
        "not a run directory",
        ["export", "{root}", "--weights", "int8", "--out", "{root}/new"],
        CHECKPOINT,
        "{root}: not a run directory (no config.yaml)",
    ),
    (
        "unknown checkpoint",
        EXPORT + ["{root}/new", "--checkpoint", "7"],
        CHECKPOINT,
        "no checkpoint '7' (have best, last, average or a step of 2, 4)",
    ),
    (
        "an export of an export",
        ["export", "{root}/exported", "--weights", "bf16", "--out", "{root}/new"],
        CHECKPOINT,
        "holds int8 weights, exported for decoding, where fp32 ones are needed",
    ),
    ("fp32 is the run itself", EXPORT[:3] + ["fp32", "--out", "{root}/new"], USAGE, "invalid choice: 'fp32'"),
    (
        "pruning an export",
        ["prune", "{root}/exported", "--split", "valid", "--fraction", "0.5"],
        CHECKPOINT,
        "{root}/exported: holds int8 weights, exported for decoding, where fp32 ones are needed",
    ),
    (
        "resuming an export",
        ["train", "{root}/good.yaml", "--out", "{root}/exported", "--resume"],
        CHECKPOINT,
        "model.safetensors: holds int8 weights, exported for decoding, where fp32 ones are needed",
    ),
]


@pytest.mark.parametrize("argv, code, message", [c[1:] for c in BAD_EXPORTS], ids=[c[0] for c in BAD_EXPORTS])
def test_bad_export_input_is_one_line_and_overwrites_nothing(workspace, capsys, argv, code, message):
    if not (workspace / "exported").exists():
        export_run(workspace / "run", workspace / "exported", "int8")
    before = snapshot(workspace)
    capsys.readouterr()
    returned = main([a.format(root=workspace) for a in argv])
    err = capsys.readouterr().err
    assert returned == code and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message.format(root=workspace) in err
    assert snapshot(workspace) == before and not (workspace / "new").exists()


def test_bench_lm_refuses_other_weights_for_an_export_in_one_line(runs, tmp_path):
    export_run(runs["lm"], tmp_path / "bf16", "bf16")
    done = run_cli("bench", "lm", "--run", str(tmp_path / "bf16"), "--weights", "int8", "--repeats", "1")
    assert done.returncode == 2 and done.stderr == (
        "error: --weights int8: the model's weights are bf16 already (a run exported with them), and do not become "
        "int8; leave --weights out\n"
    )


def test_int8_cached_decoding_stays_within_int8_rounding_of_uncached():
    """Each input of an int8 layer is quantised with one scale per tensor, so a one-token step (scale from
    that token's row of every sentence) and the whole prefix at once (scale from all of them) round
    differently: cached and uncached int8 are not equal to the bit, as fp32's are. Each is within int8
    rounding of fp32's (the test above: < 0.15 nats here), so they are within twice that of each other
    (measured: 0.083)."""
    model = with_weights(tiny_model(arch="encoder_decoder"), "int8")
    src, tgt = random_ids(3, 7), random_ids(3, 6, generator_seed=2)
    cached = DecodingSession(model, src=src, kv_cache="dynamic")
    uncached = DecodingSession(model, src=src, use_cache=False)
    with torch.no_grad():
        for t in range(6):
            a, b = cached.step(tgt[:, t : t + 1]), uncached.step(tgt[:, t : t + 1])  # (B, V) log-probabilities
            finite = a.isfinite()
            assert (b.isfinite() == finite).all()
            assert (a[finite] - b[finite]).abs().max() < 0.3
    assert greedy(model, src, max_len=6) == greedy(model, src, max_len=6, kv_cache="static")  # same one-token steps
