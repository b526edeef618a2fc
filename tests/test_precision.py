"""train.precision: auto takes bf16 only where the hardware computes in it natively, and says which
it chose; bf16 forced on a CPU without it is kept, with a warning giving the measured cost."""

from __future__ import annotations

import pytest
import torch

from attnlab import precision
from attnlab.errors import ConfigError
from attnlab.precision import autocast, choose_precision, cpu_flags

CPU = torch.device("cpu")


@pytest.fixture
def flags(monkeypatch):
    """Set the CPU flags choose_precision sees: flags({'avx2', ...})."""

    def set_flags(names: set[str]) -> None:
        monkeypatch.setattr(precision, "cpu_flags", lambda: set(names))

    return set_flags


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16", "amx_tile"}  # the first processor's
    assert cpu_flags(tmp_path / "absent") == set()


@pytest.mark.parametrize("names", [{"avx2", "avx512_bf16"}, {"avx2", "amx_bf16"}])
def test_auto_is_bf16_on_a_cpu_with_native_bf16(flags, names):
    flags(names)
    assert choose_precision("auto", CPU) == precision.PrecisionChoice(
        "bf16", "precision auto: bf16 (this CPU computes in bf16 natively)"
    )


def test_auto_is_fp32_without_native_bf16_and_says_why_with_measured_speeds(flags, monkeypatch):
    flags({"avx2", "fma"})
    speeds = {torch.bfloat16: 1.04, torch.float32: 57.7}
    monkeypatch.setattr(precision, "matmul_gflops", lambda dtype, device: speeds[dtype])
    assert choose_precision("auto", CPU) == precision.PrecisionChoice(
        "fp32",
        "precision auto: fp32 (this CPU has no native bf16; a bf16 matrix product ran at 1.0 GFLOP/s "
        "against 57.7 in fp32 here)",
    )
    forced = choose_precision("bf16", CPU)
    assert forced.precision == "bf16"
    assert forced.note == (
        "warning: train.precision is bf16 but this CPU has no native bf16: a bf16 matrix "
        "product ran at 1.0 GFLOP/s against 57.7 in fp32 here; use precision auto or fp32"
    )


def test_explicit_precisions_are_kept_without_a_note(flags):
    flags({"avx512_bf16"})
    assert choose_precision("fp32", CPU) == precision.PrecisionChoice("fp32")
    assert choose_precision("bf16", CPU) == precision.PrecisionChoice("bf16")


def test_matmul_speed_is_a_positive_rate():
    assert precision.matmul_gflops(torch.float32, CPU, n=64, repeats=1) > 0


def test_autocast_contexts():
    with autocast("fp32", CPU)():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with autocast("bf16", CPU)():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="'fp16' needs a CUDA device"):
        autocast("fp16", CPU)


def test_unset_precision_and_compile_follow_the_device():
    """Unset, train.precision is auto on a GPU and fp32 on a CPU (whose figures were measured so);
    train.compile auto compiles on CUDA only; explicit values are kept on both."""
    from attnlab.runs.train_config import TrainConfig

    cuda = torch.device("cuda")
    default = TrainConfig()
    assert (default.precision_on(cuda), default.precision_on(CPU)) == ("auto", "fp32")
    assert (default.compiles_on(cuda), default.compiles_on(CPU)) == (True, False)
    chosen = TrainConfig(precision="bf16", compile=True)
    assert (chosen.precision_on(CPU), chosen.compiles_on(CPU)) == ("bf16", True)
    assert not TrainConfig(compile=False).compiles_on(cuda)
    with pytest.raises(ConfigError, match="compile must be true, false, auto or graphs"):
        TrainConfig(compile="yes")
    with pytest.raises(ConfigError, match="compile must be true or false or a string"):
        TrainConfig(compile=1)


def test_tf32_is_allowed_for_float32_products_on_cuda_only():
    from attnlab.precision import allow_tf32

    before = torch.get_float32_matmul_precision()
    try:
        allow_tf32(CPU)
        assert torch.get_float32_matmul_precision() == before
        allow_tf32(torch.device("cuda"))  # a process-wide flag: set without a GPU too
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
