"""Tensor and pipeline parallelism (train.strategy tp, pp) under torchrun on CPU processes (gloo),
2 and 4 ranks. tp: the gradients and a clipped update of each Transformer family equal one
process's to float tolerance, each rank holding its own heads' Q, K and V. pp, GPipe and 1F1B: the
loss and gradients of one process accumulating the same micro-batches, to the bit. `attnlab train`
under either logs one process's losses, writes the usual weights file and resumes exactly; what
they cannot split is refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models import build_model, model_config
from attnlab.parallel.distributed import World
from attnlab.runs.checkpoint import load_run
from attnlab.tasks.classification import Classification
from attnlab.tasks.language_model import LanguageModel
from attnlab.tasks.masked_lm import MaskedLM
from attnlab.tasks.segment_language_model import SegmentLanguageModel
from attnlab.tasks.translation import Translation
from attnlab.train.strategy import check_strategy

from helpers import ATTNLAB, TORCHRUN, assert_sgd_step_close, run_cli, sized, why
from test_distributed import ENV, TESTS, torchrun
from tp_worker import CFG

TINY = """\
model: {stack: {d_model: 32, n_heads: 4, n_layers: 2, d_ff: 64, dropout: 0.0}}
data: {format: builtin, generator: {name: reverse}, text: {tokenizer: word}, n_train: 300, n_valid: 20, n_test: 20}
train: {max_steps: 4, max_tokens: 200, lr_schedule: constant, lr: 0.002, warmup_steps: 1, eval_every: 2,
        log_every: 1, progress: false, eval_exact_match: 4}
"""


def launched(ranks: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


@pytest.mark.parametrize(
    "ranks, families",
    [(2, ["encoder_decoder", "decoder_lm", "encoder_only"]), (4, ["encoder_decoder"])],
    ids=["2 ranks", "4 ranks"],
)
def test_tensor_parallel_gives_one_processs_gradients_and_update(tmp_path, ranks, families):
    out = tmp_path / "tp.pt"
    done = launched(ranks, str(TESTS / "tp_worker.py"), str(out), *families)
    assert done.returncode == 0, why(done)
    for arch, result in torch.load(out).items():
        assert result["blocks_ok"], f"{arch}: a rank's rows of a fused projection are not its heads' Q, K, V"
        assert_one_processs_update(arch, result["tp"], result["one"])


def assert_one_processs_update(arch: str, split: dict, one: dict) -> None:
    # The same sums in another order: each row-parallel product (W^O, W_2) adds N partial sums
    # of d / N (or d_ff / N) terms where one process adds d in one run, and the all-reduce adds the
    # partial sums in rank order. That is the reordering DDP's all-reduce makes, with DDP's
    # tolerance (tests/test_distributed.py); the loss and the gradients' norm are sums of them.
    atol, rtol = 1e-6, 1e-5
    torch.testing.assert_close(split["loss"], one["loss"], atol=0, rtol=rtol)
    torch.testing.assert_close(split["grad_norm"], one["grad_norm"], atol=0, rtol=rtol)
    assert split["grads"].keys() == one["grads"].keys()
    for name, g in one["grads"].items():
        torch.testing.assert_close(split["grads"][name], g, atol=atol, rtol=rtol, msg=lambda m: f"{arch} {name}: {m}")
    # the step applies c g, c = clip_norm / norm <= 1 (clipped here: the norm exceeds 0.5): c's
    # relative difference is the norm's, at most rtol (checked above), so c g differs by at most
    # atol + 2 rtol |g|
    assert one["grad_norm"] > CFG.clip_norm
    assert_sgd_step_close(split["weights"], one["weights"], one["grads"], CFG.lr, atol, 2 * rtol)


def test_fsdp_tp_on_2_by_2_ranks_gives_one_processs_gradients_and_update(tmp_path):
    """dp 2 x tp 2: each dp rank (a tp pair) trains one of the two batches, and the gradients that
    FSDP reduce-scatters over dp are one process's over both; fsdp adds the two dp ranks' partial
    sums, another reordering within the same tolerance."""
    out = tmp_path / "fsdp_tp.pt"
    done = launched(4, str(TESTS / "fsdp_tp_worker.py"), str(out), "encoder_decoder", "decoder_lm", "encoder_only")
    assert done.returncode == 0, why(done)
    for arch, result in torch.load(out).items():
        assert_one_processs_update(arch, result["tp"], result["one"])


def logged(run: Path) -> list[tuple[int, str, float]]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["split"], r.get("loss", r.get("valid_loss"))) for r in lines]


def test_attnlab_train_under_tp_matches_one_process_and_resumes_exactly_under_tp_only(tmp_path):
    """Every rank trains the same batches, so one process with the same config is the reference
    (no accumulation). Resumed from step 2 to step 4, the run ends with the weights of a run that
    went to 4 straight, to the bit: the weights file is split again as it was, the optimizer state
    likewise, and the same operations follow."""
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    tp = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        str(config),
        "--out",
        str(tmp_path / "tp"),
        "--set",
        "train.strategy=tp",
        "--set",
        "train.max_steps=2",
    )
    assert tp.returncode == 0, why(tp)
    resumed = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        "--out",
        str(tmp_path / "tp"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=4",
    )
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, why(resumed)
    straight = torchrun(
        "-m", "attnlab.cli", "train", str(config), "--out", str(tmp_path / "straight"), "--set", "train.strategy=tp"
    )
    assert straight.returncode == 0, why(straight)
    single = subprocess.run(
        [*ATTNLAB, "train", str(config), "--out", str(tmp_path / "single")], capture_output=True, text=True, env=ENV
    )
    assert single.returncode == 0, why(single)

    split, one = logged(tmp_path / "straight"), logged(tmp_path / "single")
    assert [r[:2] for r in split] == [r[:2] for r in one] and len(split) == 6  # 4 train lines, 2 valid
    assert [r[2] for r in split] == pytest.approx([r[2] for r in one], rel=1e-5)
    decoded = [
        json.loads((tmp_path / run / "summary.json").read_text())["last_eval"]["exact_match"]
        for run in ("straight", "single")
    ]
    assert decoded[0] == decoded[1]  # greedy decoding through the split model (its caches hold its own heads)
    resumed_weights = load_run(tmp_path / "tp", "last")[0].state_dict()  # the usual file, read by one process
    straight_weights = load_run(tmp_path / "straight", "last")[0].state_dict()
    assert resumed_weights.keys() == load_run(tmp_path / "single", "last")[0].state_dict().keys()
    for name, w in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], w, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")

    alone = subprocess.run(
        [
            *ATTNLAB,
            "train",
            "--out",
            str(tmp_path / "tp"),
            "--resume",
            "--allow-changes",
            "--set",
            "train.max_steps=6",
            "--set",
            "train.strategy=ddp",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert alone.returncode == 5 and alone.stderr.count("\n") == 1
    assert (
        "trained with train.strategy tp under torchrun, whose optimizer state resumes only the same way" in alone.stderr
    )
    under_tp = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        "--out",
        str(tmp_path / "single"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=6",
        "--set",
        "train.strategy=tp",
    )
    assert under_tp.returncode != 0
    assert (
        "trained with one process or train.strategy ddp, whose optimizer state resumes only the same way"
        in under_tp.stderr
    )


def test_attnlab_train_under_fsdp_tp_matches_one_process_and_resumes_exactly_under_it_only(tmp_path):
    """4 ranks, dp 2 x tp 2: each update takes two batches, one per dp rank, so one process
    accumulating two batches an update is the reference. Resumed from step 2 to 4, the weights are
    those of a run that went to 4 straight, to the bit; its optimizer state resumes under fsdp+tp only."""
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)

    def fsdp_tp(*args: str) -> subprocess.CompletedProcess:
        return launched(
            4,
            "-m",
            "attnlab.cli",
            "train",
            *args,
            "--set",
            "train.strategy=fsdp+tp",
            "--set",
            "train.tensor_parallel=2",
        )

    first = fsdp_tp(str(config), "--out", str(tmp_path / "split"), "--set", "train.max_steps=2")
    assert first.returncode == 0, why(first)
    resumed = fsdp_tp("--out", str(tmp_path / "split"), "--resume", "--allow-changes", "--set", "train.max_steps=4")
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, why(resumed)
    straight = fsdp_tp(str(config), "--out", str(tmp_path / "straight"))
    assert straight.returncode == 0, why(straight)
    # PyTorch's notes a user cannot act on (FSDP2's view output, DTensor's two collectives) are filtered
    assert not [line for line in straight.stderr.splitlines() if "Warning" in line or "sequential all_" in line]
    single = subprocess.run(
        [*ATTNLAB, "train", str(config), "--out", str(tmp_path / "single"), "--set", "train.accumulate=2"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert single.returncode == 0, why(single)

    split, one = logged(tmp_path / "straight"), logged(tmp_path / "single")
    assert [r[:2] for r in split] == [r[:2] for r in one] and len(split) == 6
    assert [r[2] for r in split] == pytest.approx([r[2] for r in one], rel=1e-5)
    resumed_weights = load_run(tmp_path / "split", "last")[0].state_dict()  # the usual file, read by one process
    for name, w in load_run(tmp_path / "straight", "last")[0].state_dict().items():
        torch.testing.assert_close(resumed_weights[name], w, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")
    under_tp = launched(
        4,
        "-m",
        "attnlab.cli",
        "train",
        "--out",
        str(tmp_path / "split"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=6",
        "--set",
        "train.strategy=tp",
    )
    assert under_tp.returncode != 0
    assert (
        "trained with train.strategy fsdp+tp under torchrun, whose optimizer state resumes only the same way"
        in under_tp.stderr
    )


@pytest.mark.parametrize(
    "ranks, cases",
    [
        (2, ["language_model/gpipe/2", "language_model/1f1b/4"]),
        (4, ["language_model/gpipe/2", "language_model/1f1b/4", "translation/1f1b/4"]),
        (
            2,
            [
                "masked_lm/gpipe/2",
                "masked_lm/1f1b/2",
                "classification/gpipe/2",
                "classification/1f1b/4",
                "translation/gpipe/2",
            ],
        ),
    ],
    ids=[
        "decoder-only 2 ranks",
        "decoder-only and encoder-decoder 4 ranks",
        "encoder-only and encoder-decoder 2 ranks",
    ],
)
def test_pipeline_gives_one_process_accumulating_the_micro_batches_gradients(tmp_path, ranks, cases):
    out = tmp_path / "pp.pt"
    done = launched(ranks, str(TESTS / "pp_worker.py"), str(out), *cases)
    assert done.returncode == 0, why(done)
    results = torch.load(out)
    assert list(results) == cases
    for case, result in results.items():
        assert_one_processs_accumulation(case, result["pp"], result["one"])


def assert_one_processs_accumulation(case: str, pp: dict, one: dict) -> None:
    # Each stage runs one process's operations on each micro-batch, the activations (and an
    # encoder's mask of real tokens, an encoder-decoder's memory) and their gradients cross between
    # ranks unchanged, and the micro-batches' gradients and loss sums are added in the same order
    # (the memory's gradient too: each decoder stage's added to the next's as autograd adds them
    # in one process): equal to the bit.
    assert pp["loss"].item() == one["loss"].item(), case
    assert pp["grads"].keys() == one["grads"].keys()
    for name, g in one["grads"].items():
        torch.testing.assert_close(pp["grads"][name], g, atol=0, rtol=0, msg=lambda m: f"{case} {name}: {m}")
    # the norm for clipping: the stages' norms squared and added (in float64, one all-reduce) where
    # one process adds every tensor's in float32: a sum of k non-negative terms, within k eps relative
    rtol = len(one["grads"]) * torch.finfo(torch.float32).eps
    torch.testing.assert_close(pp["grad_norm"], one["grad_norm"], atol=0, rtol=rtol)
    assert one["grad_norm"] > 0.5, case  # clipped (clip_norm 0.5): the step is c g, c within rtol
    assert_sgd_step_close(pp["weights"], one["weights"], one["grads"], 0.1, 0, rtol)


LM = """\
model: {{arch: decoder_lm, stack: {{d_model: 32, n_heads: 2, n_layers: 3, d_ff: 64, dropout: 0.0}}, embeddings: {{tie: none}}}}
data: {{format: text, train: {text}, text: {{tokenizer: char}}, block_size: 16}}
train: {{max_steps: 4, batch_size: 4, lr_schedule: constant, lr: 0.003, warmup_steps: 1, eval_every: 2,
        log_every: 1, progress: false, micro_batches: 2}}
"""
# masked LM: batches of 4 lines drawn with replacement, all padded to 16 tokens (one batch shape)
MLM = """\
model: {{arch: encoder_only, stack: {{d_model: 32, n_heads: 2, n_layers: 3, d_ff: 64, dropout: 0.0}}, embeddings: {{tie: none}},
        positions: {{scheme: learned, max_len: 16}}}}
data: {{task: masked_lm, train: {text}, text: {{tokenizer: word}}, max_len: 16, splits: {{n_valid: 20}}}}
train: {{max_steps: 4, batch_size: 4, sampling: with_replacement, pad_multiple: 16, lr_schedule: constant,
        lr: 0.003, warmup_steps: 1, eval_every: 2, log_every: 1, progress: false, micro_batches: 2}}
"""
# translation: 1 encoder and 2 decoder layers, so that the decoder starts inside the first stage
SEQ2SEQ = """\
model: {{stack: {{d_model: 32, n_heads: 4, d_ff: 64, dropout: 0.0}}, depths: {{encoder: 1, decoder: 2}},
        embeddings: {{tie: none}}}}
data: {{format: builtin, generator: {{name: reverse}}, text: {{tokenizer: word}}, n_train: 300, n_valid: 20, n_test: 20}}
train: {{max_steps: 4, batch_size: 4, sampling: with_replacement, pad_multiple: 16, lr_schedule: constant,
        lr: 0.002, warmup_steps: 1, eval_every: 2, log_every: 1, progress: false, micro_batches: 2}}
"""
WORDS = "zero one two three four five six seven eight nine ten eleven".split()
COUNTING = "".join(" ".join(WORDS[i % 6 : i % 6 + 2 + i % 7]) + "\n" for i in range(200))


@pytest.mark.parametrize(
    "template, text",
    [(LM, "to be or not to be, that is the question. " * 40), (MLM, COUNTING), (SEQ2SEQ, "")],
    ids=["decoder-only", "encoder-only masked LM", "encoder-decoder"],
)
def test_attnlab_train_under_pp_matches_one_process_and_resumes_exactly(tmp_path, template, text):
    """Every rank reads the same batches; the stages (3 layers over 2 ranks: 2 and 1; an
    encoder-decoder's encoder layers count first) split each into 2 micro-batches. Resumed from
    step 2 to 4 under pp, the weights are those of a run that went to 4 straight, to the bit. The
    merged optimizer state is one process's, so one process resumes it."""
    (tmp_path / "text.txt").write_text(text)
    config = tmp_path / "run.yaml"
    config.write_text(template.format(text=tmp_path / "text.txt"))
    first = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        str(config),
        "--out",
        str(tmp_path / "pp"),
        "--set",
        "train.strategy=pp",
        "--set",
        "train.max_steps=2",
    )
    assert first.returncode == 0, why(first)
    resumed = torchrun(
        "-m",
        "attnlab.cli",
        "train",
        "--out",
        str(tmp_path / "pp"),
        "--resume",
        "--allow-changes",
        "--set",
        "train.max_steps=4",
        "--set",
        "train.pipeline_schedule=gpipe",
    )
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, why(resumed)
    straight = torchrun(
        "-m", "attnlab.cli", "train", str(config), "--out", str(tmp_path / "straight"), "--set", "train.strategy=pp"
    )
    assert straight.returncode == 0, why(straight)
    single = subprocess.run(
        [*ATTNLAB, "train", str(config), "--out", str(tmp_path / "single")], capture_output=True, text=True, env=ENV
    )
    assert single.returncode == 0, why(single)

    piped, one = logged(tmp_path / "straight"), logged(tmp_path / "single")
    assert [r[:2] for r in piped] == [r[:2] for r in one] and len(piped) == 6
    assert [r[2] for r in piped] == pytest.approx([r[2] for r in one], rel=1e-5)  # micro-batches: sums reordered
    resumed_weights = load_run(tmp_path / "pp", "last")[0].state_dict()
    for name, w in load_run(tmp_path / "straight", "last")[0].state_dict().items():
        torch.testing.assert_close(resumed_weights[name], w, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")
    alone = subprocess.run(
        [
            *ATTNLAB,
            "train",
            "--out",
            str(tmp_path / "pp"),
            "--resume",
            "--allow-changes",
            "--set",
            "train.max_steps=5",
            "--set",
            "train.strategy=ddp",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert alone.returncode == 0 and "resuming" in alone.stdout, why(alone)


def two_ranks() -> World:
    return World(rank=0, size=2)


@pytest.mark.parametrize(
    "field, fields",
    [
        (
            "n_heads",
            dict(
                stack=dict(d_model=48, n_heads=3, d_ff=64),
            ),
        ),
        (
            "d_ff",
            dict(
                stack=dict(d_model=32, n_heads=4, d_ff=63),
            ),
        ),
    ],
)
def test_tp_refuses_a_width_or_head_count_that_does_not_divide_by_the_ranks(field, fields):
    cfg = model_config(**fields)
    with pytest.raises(
        ConfigError,
        match=rf"^train.strategy tp: model.stack.{field} \(\d+\) must be divisible by the "
        r"tensor-parallel size \(2 ranks\)$",
    ):
        check_strategy("tp", cfg, two_ranks())


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(positions=dict(scheme="alibi")), "model.positions.scheme 'alibi'"),
        (dict(stack=dict(attention_scale="learned")), "model.stack.attention_scale 'learned'"),
    ],
)
def test_tp_refuses_parameters_or_state_that_every_head_shares(fields, says):
    with pytest.raises(ConfigError, match=f"^train.strategy tp: {says}"):
        check_strategy("tp", model_config(arch="decoder_lm", **fields), two_ranks())


@pytest.mark.parametrize(
    "arch, fields, says",
    [
        (
            "decoder_lm",
            dict(stack=dict(n_layers=1)),
            r"the model's 1 layers are fewer than the pipeline stages \(2 ranks\)",
        ),
        (
            "encoder_only",
            dict(stack=dict(n_layers=1)),
            r"the model's 1 layers are fewer than the pipeline stages \(2 ranks\)",
        ),
        (
            "decoder_lm",
            dict(embeddings=dict(tie="output")),
            "model.embeddings.tie 'output' shares the first stage's embedding",
        ),
        (
            "encoder_only",
            dict(embeddings=dict(tie="all")),
            "model.embeddings.tie 'all' shares the first stage's embedding",
        ),
        ("decoder_lm", dict(multi_token_heads=2), "model.multi_token_heads are not cut into stages"),
        (
            "encoder_decoder",
            dict(embeddings=dict(tie="output")),
            "model.embeddings.tie 'output' shares the first stage's",
        ),
        (
            "encoder_decoder",
            dict(embeddings=dict(tie="src_tgt")),
            "model.embeddings.tie 'src_tgt' shares the source embedding "
            r"\(first stage\) with the target embedding",
        ),
    ],
)
def test_pp_refuses_fewer_layers_than_stages_and_what_it_cannot_cut(arch, fields, says):
    cfg = model_config(arch=arch, **{"embeddings": {"tie": "none"}, **fields})
    with pytest.raises(ConfigError, match=f"^train.strategy pp: {says}"):
        check_strategy("pp", cfg, two_ranks())
    encoder_decoder = model_config(stack=dict(n_layers=1), embeddings=dict(tie="none"))  # 1 + 1 layers on 4 ranks
    with pytest.raises(ConfigError, match=r"^train.strategy pp: the model's 2 layers .* \(4 ranks\)$"):
        check_strategy("pp", encoder_decoder, World(rank=0, size=4))


def test_pp_refuses_a_family_or_a_task_it_does_not_cut_in_one_line():
    with pytest.raises(
        ConfigError,
        match="^train.strategy pp cuts models of model.arch encoder_decoder, decoder_lm, "
        "encoder_only into stages; model.arch is 'rnn'$",
    ):
        check_strategy("pp", model_config(arch="rnn"), two_ranks())
    lm = model_config(arch="decoder_lm", embeddings=dict(tie="none"))
    with pytest.raises(
        ConfigError,
        match="^train.strategy pp: data.task segment_language_model is not trained "
        "through pipeline stages of model.arch decoder_lm$",
    ):
        check_strategy("pp", lm, two_ranks(), task=SegmentLanguageModel)
    check_strategy("pp", lm, two_ranks(), task=LanguageModel)
    encoder = model_config(arch="encoder_only", embeddings=dict(tie="none"))
    for task in (MaskedLM, Classification):
        check_strategy("pp", encoder, two_ranks(), task=task)
    check_strategy("pp", model_config(embeddings=dict(tie="none")), two_ranks(), task=Translation)


def test_pp_refuses_batches_its_micro_batches_cannot_divide_every_problem_at_once():
    """Issue 64: a token budget's batches (their rows vary) were refused at step 1, after the run
    directory existed, without naming train.sampling; now every problem in one line, before it."""
    from attnlab.data.tokenizers import Tokenizer
    from attnlab.parallel.pipeline import check_batch_rows
    from attnlab.tasks.translation import Seq2SeqData

    tokenizers = {"src": Tokenizer.train("word", ["a b"], 10), "tgt": Tokenizer.train("word", ["a b"], 10)}
    budget = Seq2SeqData(tokenizers=tokenizers, splits={"train": []}, batch_size=6)
    with pytest.raises(
        ConfigError,
        match=r"^train.strategy pp cuts every batch into train.micro_batches equal "
        r"micro-batches: the task's batches are made by a token budget "
        r"\(train.max_tokens\), so their rows vary: set train.sampling: "
        r"with_replacement, for batches of train.batch_size rows; "
        r"train.micro_batches \(4\) must divide train.batch_size \(6\)$",
    ):
        check_batch_rows(budget, 4)
    drawn = Seq2SeqData(tokenizers=tokenizers, splits={"train": []}, batch_size=8, sampling="with_replacement")
    check_batch_rows(drawn, 4)
    with pytest.raises(ConfigError, match=r"must divide train.batch_size \(8\)$"):
        check_batch_rows(drawn, 3)


def test_1f1b_with_fewer_micro_batches_than_stages_is_refused_in_one_line():
    from attnlab.parallel.pipeline import Pipeline

    model = build_model(*sized(arch="decoder_lm", vocab_size=30, stack=dict(n_layers=2), embeddings=dict(tie="none")))
    with pytest.raises(
        ConfigError,
        match=r"^train.pipeline_schedule 1f1b needs train.micro_batches \(1\) of at "
        r"least the pipeline stages \(2 ranks\)$",
    ):
        Pipeline(model, two_ranks(), LanguageModel, "1f1b", 1, torch.device("cpu"))


def test_fsdp_tp_refuses_a_tensor_parallel_size_that_does_not_divide_the_ranks_or_the_heads():
    cfg = model_config(
        stack=dict(d_model=48, n_heads=6, d_ff=96),
    )
    with pytest.raises(
        ConfigError,
        match=r"^train.strategy fsdp\+tp: train.tensor_parallel \(4\) must divide the "
        r"torchrun ranks \(6\)$",
    ):
        check_strategy("fsdp+tp", cfg, World(rank=0, size=6), tensor_parallel=4)
    with pytest.raises(
        ConfigError,
        match=r"^train.strategy fsdp\+tp: model.stack.n_heads \(6\) must be divisible by the "
        r"tensor-parallel size \(4 ranks\)$",
    ):
        check_strategy("fsdp+tp", cfg, World(rank=0, size=8), tensor_parallel=4)
    check_strategy("fsdp+tp", cfg, World(rank=0, size=6), tensor_parallel=3)  # dp 2 x tp 3


@pytest.mark.parametrize("strategy", ["tp", "pp", "fsdp+tp"])
def test_tp_or_pp_without_torchrun_is_refused_in_one_line(tmp_path, strategy):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"), "--set", f"train.strategy={strategy}")
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr == (
        f"error: train.strategy {strategy} splits the model across processes: start it with "
        f"torchrun --nproc_per_node N (N >= 2), or use train.strategy ddp\n"
    )
