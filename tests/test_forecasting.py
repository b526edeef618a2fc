"""The forecasting task: the CSV reader and its errors, the protocol (splits, scaling with the
training rows only, every window with stride 1, window counts), the MSE/MAE against numpy, and the
commands (train, evaluate on a longer file's test rows, forecast with a plot) end to end."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import ConfigError, DataError, UsageError, task_config
from attnlab.cli.forecast import origin_row
from attnlab.data.series import Scaler, future_dates, read_series, split_bounds, split_rows, window_starts
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks.batching import Batching

from helpers import run_cli

COLUMNS = ("load", "price", "temp")


def series_rows(n: int, seed: int = 0) -> np.ndarray:
    """(n, 3): a daily cycle with noise, a 12-hour cycle around 5, and a slow trend with noise."""
    t = np.arange(n)
    noise = np.random.default_rng(seed).normal(size=(n, 3))
    return np.stack(
        [
            np.sin(2 * np.pi * t / 24) + 0.1 * noise[:, 0],
            5 + 2 * np.cos(2 * np.pi * t / 12),
            0.01 * t + 0.2 * noise[:, 2],
        ],
        axis=1,
    )


def write_series(path: Path, values: np.ndarray, columns=COLUMNS, date_column: str = "date") -> Path:
    start = datetime(2020, 1, 1)
    lines = [",".join([date_column, *columns])]
    lines += [
        ",".join([(start + timedelta(hours=i)).strftime("%Y-%m-%d %H:%M:%S"), *(f"{v:.6f}" for v in row)])
        for i, row in enumerate(values)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


SPLITS = ("n_train", "n_valid", "n_test", "valid_fraction", "test_fraction")  # data.splits' fields


def config(path: Path, **fields) -> object:
    """A forecasting section of ``fields``, those named in SPLITS its ``splits`` part's."""
    splits = {"n_train": 100, "n_valid": 40, "n_test": 40} | {k: v for k, v in fields.items() if k in SPLITS}
    return task_config(
        {"task": "forecasting", "path": str(path), "input_length": 24, "horizon": 8, "splits": splits}
        | {k: v for k, v in fields.items() if k not in SPLITS}
    )


def prepare(cfg, state=None):
    return cfg.task.prepare(Batching(0, 16, 0), state=state)


# -- reading -----------------------------------------------------------------------------------------


def test_the_reader_takes_the_date_and_every_other_column(tmp_path):
    values = series_rows(5)
    series = read_series(write_series(tmp_path / "s.csv", values))
    assert series.columns == list(COLUMNS) and series.dates[1] == "2020-01-01 01:00:00"
    np.testing.assert_allclose(series.values, values, atol=5e-7)
    assert read_series(tmp_path / "s.csv", columns=["temp", "load"]).values[0].tolist() == pytest.approx(
        [values[0, 2], values[0, 0]], abs=5e-7
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("date,a,b\n2020-01-01,1,2\n2020-01-02,3,x\n", "s.csv:3:3: 'x' in column 'b' is not a number"),
        ("date,a,b\n2020-01-01,1,\n", "s.csv:2:3: an empty cell in column 'b' is not a number"),
        ("date,a,b\n2020-01-01,1,nan\n", "s.csv:2:3: 'nan' in column 'b' is not a finite number"),
        (
            "time,a,b\n2020-01-01,1,2\n",
            "s.csv:1: no date column 'date' in the header (time, a, b); name it with data.date_column",
        ),
        ("date,a,b\n2020-01-01,1\n", "s.csv:2: 2 fields, but the header has 3"),
        ("date,a,b\n", "s.csv: a header and no rows"),
        ("", "s.csv: empty file (expected a header line, e.g. date,value)"),
        ("date\n2020-01-01\n", "s.csv:1: no value columns beside 'date'"),
    ],
)
def test_bad_csv_is_named_by_file_line_and_column(tmp_path, text, message):
    (tmp_path / "s.csv").write_text(text)
    with pytest.raises(DataError) as err:
        read_series(tmp_path / "s.csv")
    assert str(err.value) == f"{tmp_path}/{message}"


# -- the protocol ------------------------------------------------------------------------------------


def test_the_scaler_uses_the_training_rows_only(tmp_path):
    """Changing a validation or test value leaves the scaler, and every training window, unchanged;
    changing a training value changes it. The scaler is the population mean and std of rows 0-99."""
    values = series_rows(180)
    data = prepare(config(write_series(tmp_path / "s.csv", values)))
    np.testing.assert_allclose(data.scaler.mean, values[:100].mean(0), atol=1e-6)
    np.testing.assert_allclose(data.scaler.std, values[:100].std(0), atol=1e-6)
    for row in (100, 150):  # a validation row, a test row
        changed = values.copy()
        changed[row] += 1000.0
        other = prepare(config(write_series(tmp_path / "changed.csv", changed)))
        assert other.scaler == data.scaler
        assert torch.equal(other.values[:100], data.values[:100])
    changed = values.copy()
    changed[99, 0] += 1000.0
    assert prepare(config(write_series(tmp_path / "changed.csv", changed))).scaler.mean[0] != data.scaler.mean[0]


def test_window_counts_follow_the_protocol(tmp_path):
    """train R - L - H + 1 windows, valid and test R - H + 1 (their inputs reach back L rows)."""
    data = prepare(config(write_series(tmp_path / "s.csv", series_rows(180))))
    assert {name: len(starts) for name, starts in data.splits.items()} == {"train": 69, "valid": 33, "test": 33}
    assert data.splits["valid"][0] == 100 - 24 and data.splits["test"][-1] == 180 - 24 - 8
    # ETT hourly at input 336: train 8,640 - 336 - H + 1, valid and test 2,880 - H + 1
    bounds = split_bounds((8640, 2880, 2880))
    for horizon, train, held in ((96, 8209, 2785), (192, 8113, 2689), (336, 7969, 2545), (720, 7585, 2161)):
        assert [len(window_starts(bounds[s], 336, horizon)) for s in ("train", "valid", "test")] == [train, held, held]


def test_a_window_is_its_rows_standardised(tmp_path):
    values = series_rows(180)
    data = prepare(config(write_series(tmp_path / "s.csv", values)))
    batch = data.eval_batches("valid")[0]
    first = (values[76:108] - values[:100].mean(0)) / values[:100].std(0)  # rows 76-99 in, 100-107 out
    np.testing.assert_allclose(batch.inputs[0].numpy(), first[:24], atol=1e-5)
    np.testing.assert_allclose(batch.targets[0].numpy(), first[24:], atol=1e-5)
    assert batch.n_targets == len(batch.targets) * 8 * 3


def test_epochs_draw_their_order_from_the_seed_and_cover_every_window(tmp_path):
    data = prepare(config(write_series(tmp_path / "s.csv", series_rows(180))))
    first = [b.inputs for b in data.epoch_batches(0)]
    assert all(torch.equal(a, b.inputs) for a, b in zip(first, data.epoch_batches(0)))
    assert not torch.equal(first[0], data.epoch_batches(1)[0].inputs)
    assert sum(len(x) for x in first) == 69


def test_the_fractions_split_as_autoformer(tmp_path):
    assert split_rows(1000, None, 0.1, 0.2) == (700, 100, 200)
    assert split_rows(1001, None, 0.1, 0.2) == (701, 100, 200)
    cfg = task_config(
        {
            "task": "forecasting",
            "path": str(write_series(tmp_path / "s.csv", series_rows(300))),
            "input_length": 24,
            "horizon": 8,
        }
    )
    assert prepare(cfg).rows == (210, 30, 60)


def test_a_file_that_stops_before_the_test_rows_has_no_test_split(tmp_path):
    cfg = config(write_series(tmp_path / "dev.csv", series_rows(140)))
    data = prepare(cfg)
    assert list(data.splits) == ["train", "valid"]
    assert "test: not in the file" in cfg.task.describe(data)
    with pytest.raises(DataError, match=r"dev.csv has 140 rows; split 'test' is rows 140-179"):
        cfg.task.evaluate_file(None, {}, cfg.task.saved_state(data), str(tmp_path / "dev.csv"), "test")


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"n_train": 30},
            "split 'train' (rows 0-29) is 30 rows, too short for one window: it needs input_length + "
            "horizon (24 + 8 = 32)",
        ),
        ({"n_valid": 5}, "split 'valid' (rows 100-104) is 5 rows, too short for one window: it needs horizon (8)"),
        ({"n_train": 500}, "s.csv: 180 rows, fewer than the 500 training rows (data.splits.n_train)"),
    ],
)
def test_a_series_too_short_for_a_window_is_refused(tmp_path, fields, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        prepare(config(write_series(tmp_path / "s.csv", series_rows(180)), **fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"n_train": 100, "n_valid": None, "n_test": None},
            "give all of splits.n_train, n_valid and n_test",
        ),
        ({"horizon": 0}, "horizon"),
        (
            {"valid_fraction": 0.5, "test_fraction": 0.5, "n_train": None, "n_valid": None, "n_test": None},
            "splits.valid_fraction \\+ splits.test_fraction must be < 1, to leave training data",
        ),
        ({"columns": " , "}, "columns must name at least one column"),
    ],
)
def test_the_data_section_refuses_early(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path / "s.csv", **fields)


def test_origins_and_future_dates():
    series = read_series_of(["2020-01-01 00:00:00", "2020-01-01 01:00:00"])
    assert origin_row(None, series) == 2 and origin_row("1", series) == 1
    assert origin_row("2020-01-01 01:00:00", series) == 1
    with pytest.raises(Exception, match="neither a row number nor a date"):
        origin_row("yesterday", series)
    hourly = read_series_of([f"2017-10-{d:02} {h:02}:00:00" for d in (19, 20) for h in range(24)])
    assert origin_row("2017-10-20", hourly) == 24  # the day's first hour: the one row it names
    assert origin_row("2017-10-20T05:00", hourly) == origin_row("2017-10-20 05:00:00", hourly) == 29
    with pytest.raises(UsageError) as refused:
        origin_row("2017-10-20 05:30", hourly)
    assert str(refused.value) == (
        "--origin '2017-10-20 05:30' is no date of s.csv; the nearest rows are 28 "
        "(2017-10-20 04:00:00), 29 (2017-10-20 05:00:00), 30 (2017-10-20 06:00:00) (give a "
        "row number or one of its dates)"
    )
    twice = read_series_of(["2020-01-01 00:00:00", "2020-01-01"])
    with pytest.raises(UsageError, match="is the date of 2 rows of s.csv"):
        origin_row("2020-01-01T00:00", twice)
    assert future_dates(series.dates, 2) == ["2020-01-01 02:00:00", "2020-01-01 03:00:00"]
    assert future_dates(["a", "b"], 2) == ["t+1", "t+2"]
    assert future_dates(["2020-01-01", "2020-01-08"], 1) == ["2020-01-15"]


def read_series_of(dates):
    from attnlab.data.series import Series

    return Series("s.csv", dates, ["x"], np.zeros((len(dates), 1)))


def test_the_inverse_of_the_scaler():
    scaler = Scaler.fitted(np.array([[1.0, 5.0], [3.0, 5.0]]))
    assert scaler.std == [1.0, 1.0] and scaler.mean == [2.0, 5.0]  # a constant column keeps std 1
    assert scaler.inverse(torch.tensor([[1.0, 0.0]])).tolist() == [[3.0, 5.0]]


# -- end to end ----------------------------------------------------------------------------------------


def recipe(tmp_path: Path, arch: str, csv: Path, **model) -> Path:
    path = tmp_path / f"{arch}.yaml"
    path.write_text(
        json.dumps(
            {
                "model": {"arch": arch, **model},
                "data": {
                    "task": "forecasting",
                    "path": str(csv),
                    "input_length": 24,
                    "horizon": 8,
                    "splits": {"n_train": 100, "n_valid": 40, "n_test": 40},
                },
                "train": {
                    "max_steps": 40,
                    "batch_size": 16,
                    "lr_schedule": "constant",
                    "lr": 0.01,
                    "warmup_steps": 1,
                    "eval_every": 20,
                    "progress": False,
                    "seed": 0,
                },
            }
        )
    )
    return path


def last_value_mse(values: np.ndarray, first: int, end: int, L: int = 24, H: int = 8) -> tuple[float, float]:
    """MSE and MAE of repeating the last input row, over the windows of rows [first, end), by numpy."""
    scaled = (values - values[:100].mean(0)) / values[:100].std(0)
    errors = np.stack(
        [scaled[s + L : s + L + H] - scaled[s + L - 1] for s in range(max(first - L, 0), end - L - H + 1)]
    )
    return float(np.square(errors).mean()), float(np.abs(errors).mean())


def test_the_last_value_baseline_end_to_end(tmp_path):
    """A model with nothing to learn is evaluated and saved once; evaluate scores the run's own
    split and a longer file's test rows as numpy does; forecast writes the next rows and a plot."""
    values = series_rows(200)
    dev, full = write_series(tmp_path / "dev.csv", values[:140]), write_series(tmp_path / "full.csv", values)
    done = run_cli("train", str(recipe(tmp_path, "last_value", dev)), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "stopped after 0 steps (nothing to learn: the model has no trainable parameters)" in done.stdout
    assert "train 69 (rows 0-99), valid 33 (rows 100-139), test: not in the file" in done.stdout
    mse, mae = last_value_mse(values, 100, 140)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["best_valid_loss"] == pytest.approx(mse)

    done = run_cli("evaluate", str(tmp_path / "run"), "--split", "valid", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["mse"], result["mae"], result["windows"]) == (pytest.approx(mse), pytest.approx(mae), 33)
    done = run_cli("evaluate", str(tmp_path / "run"), "--data", str(full), "--split", "test", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    mse, mae = last_value_mse(values, 140, 180)
    assert (result["mse"], result["mae"], result["windows"]) == (pytest.approx(mse), pytest.approx(mae), 33)
    assert result["mse_by_channel"] == pytest.approx(
        [last_value_mse(values[:, [c]], 140, 180)[0] for c in range(3)], rel=1e-6
    )
    assert np.mean(result["mse_by_step"]) == pytest.approx(mse)
    done = run_cli("evaluate", str(tmp_path / "run"), "--data", str(full), "--plot", str(tmp_path / "lead.png"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"MSE  {mse:.4f}   MAE  {mae:.4f}   (33 windows of split 'test', rows 140-179")
    assert (tmp_path / "lead.png").stat().st_size > 0
    done = run_cli("evaluate", str(tmp_path / "run"), "--data", str(dev), "--split", "test")
    assert done.returncode == 4 and "dev.csv has 140 rows; split 'test' is rows 140-179" in done.stderr

    done = run_cli(
        "forecast",
        str(tmp_path / "run"),
        "--data",
        str(full),
        "--origin",
        "150",
        "--plot",
        str(tmp_path / "f.png"),
        "--channels",
        "load,temp",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "date,load,price,temp" and len(lines) == 9
    assert lines[1].startswith("2020-01-07 06:00:00,")  # row 150
    assert [float(v) for v in lines[8].split(",")[1:]] == pytest.approx(values[149].tolist(), abs=1e-5)
    assert "this window (rows 150-157): MSE" in done.stderr and (tmp_path / "f.png").stat().st_size > 0
    done = run_cli("forecast", str(tmp_path / "run"), "--data", str(full))  # after the last row: dates go on
    assert done.returncode == 0 and done.stdout.splitlines()[1].startswith("2020-01-09 08:00:00,")


def test_dlinear_learns_the_cycles_better_than_repeating_the_last_value(tmp_path):
    values = series_rows(200)
    csv = write_series(tmp_path / "s.csv", values)
    done = run_cli("train", str(recipe(tmp_path, "dlinear", csv, kernel_size=5)), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["best_valid_loss"] < 0.5 * last_value_mse(values, 100, 140)[0]
    model, _, _ = load_run(tmp_path / "run")
    run = RunDir(tmp_path / "run")
    data = read_run_data(run, "valid")
    scores = run.read_config()[1].task.validate(model, data, torch.device("cpu"), contextlib.nullcontext, 0)
    assert scores["valid_loss"] == pytest.approx(summary["best_valid_loss"])


def test_the_commands_refuse_bad_input_in_one_line(tmp_path):
    values = series_rows(200)
    csv = write_series(tmp_path / "s.csv", values)
    done = run_cli("train", str(recipe(tmp_path, "last_value", csv)), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text(csv.read_text().replace("\n2020-01-01 05:00:00,", "\n2020-01-01 05:00:00,oops", 1))
    for args, code, message in (
        (("forecast", "--data", str(bad)), 4, f"{bad}:7:2: 'oops"),
        (
            ("forecast", "--data", str(write_series(tmp_path / "t.csv", values, date_column="time"))),
            4,
            "no date column 'date'",
        ),
        (
            ("forecast", "--data", str(write_series(tmp_path / "o.csv", values, columns=("load", "cost", "temp")))),
            4,
            "no column 'price'",
        ),
        (("forecast", "--data", str(csv), "--origin", "10"), 2, "--origin must leave input_length (24) rows"),
        (("forecast", "--data", str(csv), "--channels", "wind"), 2, "--channels must name columns of the run"),
        (("evaluate", "--src", "x"), 2, "give --data FILE (and --split NAME"),
    ):
        done = run_cli(args[0], str(tmp_path / "run"), *args[1:])
        assert done.returncode == code and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    (tmp_path / "plot.png").write_text("mine")
    done = run_cli("forecast", str(tmp_path / "run"), "--data", str(csv), "--plot", str(tmp_path / "plot.png"))
    assert done.returncode == 2 and (tmp_path / "plot.png").read_text() == "mine"


def test_a_run_on_the_development_copy_scores_the_full_files_test_months(tmp_path):
    """ETT's layout and protocol: trained on the first 11,520 rows (the development copy), the run
    is evaluated on a 17,420-row file's test months, rows 11,520-14,399: 2,880 - 96 + 1 windows,
    scaled with the training rows' statistics, as numpy computes them."""
    columns = ("HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
    values = np.concatenate([series_rows(17_420, 0), series_rows(17_420, 1), series_rows(17_420, 2)], axis=1)[:, :7]
    dev, full = (
        write_series(tmp_path / name, rows, columns)
        for name, rows in (("dev.csv", values[:11_520]), ("full.csv", values))
    )
    path = tmp_path / "last_value.yaml"
    path.write_text(
        json.dumps(
            {
                "model": {"arch": "last_value"},
                "data": {
                    "task": "forecasting",
                    "path": str(dev),
                    "input_length": 336,
                    "horizon": 96,
                    "splits": {"n_train": 8640, "n_valid": 2880, "n_test": 2880},
                },
                "train": {"lr_schedule": "constant", "progress": False},
            }
        )
    )
    done = run_cli("train", str(path), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "train 8,209 (rows 0-8,639), valid 2,785 (rows 8,640-11,519), test: not in the file" in done.stdout
    done = run_cli("evaluate", str(tmp_path / "run"), "--data", str(full), "--split", "test", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    scaled = (values - values[:8640].mean(0)) / values[:8640].std(0)
    errors = np.stack([scaled[s + 336 : s + 432] - scaled[s + 335] for s in range(11_520 - 336, 14_400 - 432 + 1)])
    assert (result["windows"], result["rows"]) == (2785, [11_520, 14_400])
    assert result["mse"] == pytest.approx(float(np.square(errors).mean()))
    assert result["mae"] == pytest.approx(float(np.abs(errors).mean()))


def test_info_counts_a_forecaster_from_the_files_columns(tmp_path):
    csv = write_series(tmp_path / "s.csv", series_rows(200))
    done = run_cli("info", str(recipe(tmp_path, "dlinear", csv, kernel_size=5, individual=True)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("dlinear, channels 3, input 24, horizon 8")
    assert lines[1].split() == ["parameters", f"{2 * 3 * (24 * 8 + 8):,}"]  # two maps per channel, L -> H
