"""The `attnlab` command end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
ATTNLAB = Path(sys.executable).parent / "attnlab"


def test_info_base_preset_has_the_papers_parameter_count(capsys):
    assert main(["info", str(ROOT / "configs/transformer_base.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params_total"] == 63_082_496
    assert report["components"] == {"src_embed": 18_944_000, "encoder": 18_914_304, "decoder": 25_224_192}
    assert report["layers"]["encoder.layers.0"] == {"self_attention": 1_050_624, "norm": 2_048, "feed_forward": 2_099_712}
    assert report["layers"]["decoder.layers.5"]["cross_attention"] == 1_050_624


def test_info_big_preset(capsys):
    assert main(["info", str(ROOT / "configs/transformer_big.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params_total"] == 214_245_376


def test_info_table_runs_as_a_console_script():
    done = subprocess.run([str(ATTNLAB), "info", str(ROOT / "configs/transformer_base.yaml")],
                          capture_output=True, text=True, check=True)
    assert "63,082,496" in done.stdout
    assert "encoder.layers.0-5" in done.stdout and "3,152,384 each" in done.stdout


@pytest.mark.parametrize("text,code,message", [
    (None, 3, "no such config file"),
    ("model:\n  vocab_size: 10\n  n_heads: 3\n", 3, "d_model (512) must be divisible by n_heads (3)"),
    ("model: [1\n", 3, "YAML does not parse"),
])
def test_bad_config_is_one_line_and_an_exit_code(tmp_path, text, code, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    done = subprocess.run([str(ATTNLAB), "info", str(path)], capture_output=True, text=True)
    assert done.returncode == code
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0] and str(path) in lines[0]


def test_usage_error_and_debug(tmp_path, capsys):
    assert main(["info"]) == 2
    assert "required: config" in capsys.readouterr().err
    with pytest.raises(Exception, match="no such config file"):
        main(["--debug", "info", str(tmp_path / "none.yaml")])
