"""`attnlab info` says, per exporter, whether a config's or a run's model exports (issue 64, item 3):
the answer is the exporter's own check (HFConverter.refusal, export-ct2's export_refusals), so that
info's reason is the line export-hf itself prints when it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnlab.interop import EXPORTERS, ct2

from helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
GPT2_RECIPE = ROOT / "recipes/export/gpt2_shakespeare.yaml"
CHAR = ROOT / "configs/shakespeare_char.yaml"
OTHER_ARCH = {
    "export-hf audio-spectrogram-transformer": (
        "arch 'decoder_lm': audio-spectrogram-transformer folders are written from arch 'ast' runs"
    ),
    "export-hf bert": "arch 'decoder_lm': bert folders are written from arch 'encoder_only' runs",
    "export-hf marian": "arch 'decoder_lm': marian folders are written from arch 'encoder_decoder' runs",
    "export-hf vit": "arch 'decoder_lm': vit folders are written from arch 'vit' runs",
    "export-hf whisper": "arch 'decoder_lm': whisper folders are written from arch 'whisper' runs",
}
GPT2_REFUSES_CHAR = (
    "GPT-2 has no counterpart for embeddings.kind 'scaled' (GPT-2's is 'plain'); "
    "embeddings.tie 'all' (GPT-2's is 'output')"
)


def export_report(*args: str) -> dict:
    done = run_cli("info", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["export"]


def test_the_gpt2_recipe_exports_and_the_char_preset_does_not_with_gpt2s_reasons():
    assert export_report(str(GPT2_RECIPE)) == {**OTHER_ARCH, "export-hf gpt2": None, "export-ct2": ct2.missing_extra()}
    assert export_report(str(CHAR)) == {
        **OTHER_ARCH,
        "export-hf gpt2": GPT2_REFUSES_CHAR,
        "export-ct2": f"CTranslate2 deploys it as GPT-2, which has no counterpart "
        f"for {GPT2_REFUSES_CHAR.removeprefix('GPT-2 has no counterpart for ')}",
    }


def test_the_table_prints_one_row_per_exporter():
    done = run_cli("info", str(CHAR))
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("\nexportable:\n")[1].splitlines()
    name = "  {:<41}no: ".format  # the longest name (export-hf audio-spectrogram-transformer) and two spaces
    assert table == [
        name("export-hf audio-spectrogram-transformer") + OTHER_ARCH["export-hf audio-spectrogram-transformer"],
        name("export-hf bert") + OTHER_ARCH["export-hf bert"],
        name("export-hf gpt2") + GPT2_REFUSES_CHAR,
        name("export-hf marian") + OTHER_ARCH["export-hf marian"],
        name("export-hf vit") + OTHER_ARCH["export-hf vit"],
        name("export-hf whisper") + OTHER_ARCH["export-hf whisper"],
        name("export-ct2") + "CTranslate2 deploys it as GPT-2, which has no counterpart for embeddings.kind 'scaled' "
        "(GPT-2's is 'plain'); embeddings.tie 'all' (GPT-2's is 'output')",
    ]
    assert len(table) == len(EXPORTERS) + 1


def test_overrides_change_the_answer():
    """The two settings GPT-2 names are all that stands between the char preset and an export."""
    report = export_report(str(CHAR), "--set", "model.embeddings.kind=plain", "--set", "model.embeddings.tie=output")
    assert report["export-hf gpt2"] is None
    report = export_report(str(GPT2_RECIPE), "--set", "model.stack.norm=post")
    assert report["export-hf gpt2"] == "GPT-2 has no counterpart for stack.norm 'post' (GPT-2's is 'pre')"


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes/export").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_export_recipe_is_exportable_by_its_familys_exporter_only(recipe):
    report = export_report(str(recipe))
    yes = {name for name, why in report.items() if why is None}
    arch = yaml.safe_load(recipe.read_text())["model"]["arch"]
    assert yes - {"export-ct2"} == {f"export-hf {EXPORTERS[arch].model_type}"}
    assert all(
        why.startswith(f"arch '{arch}': ") for name, why in report.items() if name.startswith("export-hf") and why
    )


def test_marian_refuses_a_config_whose_sides_get_their_own_vocabularies():
    recipe = str(ROOT / "recipes/export/marian_multi30k.yaml")
    assert export_report(recipe)["export-hf marian"] is None
    assert export_report(recipe, "--set", "data.pairs.shared_vocab=false")["export-hf marian"] == (
        "Marian, opus-mt has no counterpart for separate source and target vocabularies (Marian's one vocab.json "
        "numbers both sides)"
    )


def test_a_model_config_without_data_says_what_decides(capsys):
    done = run_cli("info", str(ROOT / "configs/transformer_base.yaml"))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == (
        "exportable: the data section decides too (tokenizer, task); give a training config or a run to see what "
        "export-hf and export-ct2 say"
    )
    assert "export" not in json.loads(run_cli("info", str(ROOT / "configs/transformer_base.yaml"), "--json").stdout)


def test_a_runs_answer_is_the_line_export_hf_refuses_with_and_reads_the_runs_files(tmp_path):
    """A run of the char preset: info's gpt2 reason is export-hf's error, less the run's path. A run of
    the GPT-2 recipe exports, until heads are pruned out of it (what only the run's files say)."""
    small = ["--set", "model.stack.n_layers=1", "--set", "model.stack.d_model=32", "--set", "model.stack.d_ff=64"]
    words = "a little dog runs over the green grass while two men watch it".split()
    (tmp_path / "input.txt").write_text(
        "".join(" ".join(words[(i + j) % len(words)] for j in range(3 + i % 5)) + "\n" for i in range(200))
    )
    sets = [
        item
        for line in (
            "train.max_steps=2",
            "train.eval_every=2",
            "train.warmup_steps=1",
            "train.warmup_ratio=null",
            f"data.train={tmp_path / 'input.txt'}",
            "data.text.vocab_size=300",
        )
        for item in ("--set", line)
    ]
    char, gpt2 = tmp_path / "char", tmp_path / "gpt2"
    for config, out in ((CHAR, char), (GPT2_RECIPE, gpt2)):
        done = run_cli("train", str(config), "--out", str(out), *sets, *small)
        assert done.returncode == 0, done.stderr
    refused = run_cli("export-hf", str(char), "--out", str(tmp_path / "hf"))
    assert refused.returncode == 3
    assert refused.stderr.strip() == f"error: {char}: {GPT2_REFUSES_CHAR}"
    assert export_report(str(char))["export-hf gpt2"] == GPT2_REFUSES_CHAR
    assert export_report(str(gpt2))["export-hf gpt2"] is None
    pruned = run_cli("prune", str(gpt2), "--fraction", "0.25", "--out", str(tmp_path / "pruned"))
    assert pruned.returncode == 0, pruned.stderr
    assert export_report(str(tmp_path / "pruned"))["export-hf gpt2"] == (
        "GPT-2 has no counterpart for pruned heads (GPT-2 has n_head in every layer)"
    )
    refused = run_cli("export-hf", str(tmp_path / "pruned"), "--out", str(tmp_path / "hf"))
    assert refused.stderr.strip() == (
        f"error: {tmp_path / 'pruned'}: GPT-2 has no counterpart for pruned heads (GPT-2 has n_head in every layer)"
    )
