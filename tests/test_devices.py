"""Devices given by their memory alone or a catalog device with overrides (memory, bandwidth, power limit):
the API, the setup that carries the overridden spec, the fit and the step time they change, the CLI and its
one-line unit errors."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

import trainfit
from trainfit import TrainingSetup, device, estimate
from trainfit.catalog import POWER_CAP_EXPONENT, Hardware, power_cap_factor
from trainfit.cli import app
from trainfit.errors import TrainfitError
from trainfit.refs import resolve_device
from trainfit.steptime import setup_step_time
from trainfit.units import GiB

runner = CliRunner()
H100 = Hardware.get("h100")
#: Llama-3.1-8B, first-order, ZeRO-3 over 8 ranks, global batch 64 x 2048: 89.17 GB per device, between an
#: 80 GiB (85.90 GB) and a 96 GiB (103.08 GB) device
FIT = dict(batch=64, seq_len=2048, dp=8, zero=3, checkpointing="selective")


def test_memory_alone_is_a_generic_device_with_the_stated_profile():
    d = device(memory="24GiB")
    rtx = Hardware.get("rtx4090")
    assert d.capacity_bytes == 24 * GiB and d.spec.memory.capacity == 24 * GiB
    assert d.spec.flops("bf16") == rtx.flops("bf16") and d.spec.memory.bandwidth == rtx.memory.bandwidth
    assert "generic" in d.name and rtx.name in d.name and d.overrides
    assert device(memory="24 GB").capacity_bytes == 24e9
    assert resolve_device("24GiB") == d  # a size where a device name goes means the same
    assert trainfit.device is device


def test_overrides_are_carried_by_the_setup():
    d = device("h100", memory="96GiB", hbm_bandwidth="2.4TB/s", power_limit="500W")
    s = TrainingSetup.build("llama-3.1-8b", d)
    assert s.hardware.capacity_bytes == 96 * GiB and s.hardware.spec.memory.bandwidth == 2.4e12
    assert s.hardware.spec.power_limit == 500 and s.hardware.spec.key == "H100"
    assert [o.split(" (")[0] for o in s.hardware.overrides] == ["memory 96 GiB", "HBM 2.4 TB/s", "power limit 500 W"]
    assert "power limit 500 W" in s.hardware.name
    assert s.hardware != resolve_device("h100")  # a setup on the capped device is not the catalog's


def test_memory_override_changes_the_fit():
    on80 = estimate(TrainingSetup.build("llama-3.1-8b", "h100", **FIT), method="first-order")
    on96 = estimate(TrainingSetup.build("llama-3.1-8b", device("h100", memory="96GiB"), **FIT), method="first-order")
    assert on80.total_bytes == on96.total_bytes  # the memory a step needs does not depend on the device's size
    assert on80.feasible is False and on96.feasible is True


def test_memory_override_on_top_of_a_device_keeps_its_compute():
    d = device("rtx4090", memory="48GiB")
    assert d.capacity_bytes == 48 * GiB and d.spec.flops("bf16") == Hardware.get("rtx4090").flops("bf16")
    assert d.platform == "cuda" and d.tier == "workstation"


def test_power_cap_scales_compute_by_the_cube_root_and_leaves_memory():
    assert POWER_CAP_EXPONENT == pytest.approx(1 / 3)
    factor = (500 / 700) ** (1 / 3)  # 0.894
    d = device("h100", power_limit="500W")
    assert power_cap_factor(700, 500) == pytest.approx(factor)
    assert d.spec.flops("bf16") == pytest.approx(989e12 * factor)
    assert d.spec.flops("fp8") == pytest.approx(1979e12 * factor)
    assert d.spec.flops("fp32") == pytest.approx(67e12 * factor)
    assert d.capacity_bytes == H100.memory.capacity and d.spec.memory.bandwidth == H100.memory.bandwidth
    # at or above the TDP the limit does not bind
    assert device("h100", power_limit="800W").spec.flops("bf16") == 989e12


def test_power_cap_and_bandwidth_change_step_time_as_stated():
    def st(hw):
        return setup_step_time(TrainingSetup.build("llama-3.1-8b", hw, batch=8, seq_len=2048))

    base, capped = st("h100"), st(device("h100", power_limit="500W"))
    slow = st(device("h100", hbm_bandwidth="2.4TB/s"))
    # GEMM time is FLOPs / (peak x efficiency): the peak falls by (500/700)^(1/3), the time rises by its inverse
    assert capped.components["gemm"] / base.components["gemm"] == pytest.approx((700 / 500) ** (1 / 3), rel=1e-9)
    assert capped.components["memory_bound"] == pytest.approx(base.components["memory_bound"], rel=1e-12)
    assert capped.seconds > base.seconds
    # memory-bound kernels read the bandwidth: 3.35 / 2.4 TB/s slower, the GEMMs untouched
    assert slow.components["memory_bound"] / base.components["memory_bound"] == pytest.approx(3.35 / 2.4, rel=1e-9)
    assert slow.components["gemm"] == pytest.approx(base.components["gemm"], rel=1e-12)
    # MFU divides by the datasheet peak (torchtitan's and Megatron's definition), not the capped one
    spec = device("h100", power_limit="500W").spec
    assert capped.mfu == pytest.approx(capped.tflops_per_device * 1e12 / spec.datasheet_flops("bf16"), rel=1e-9)
    assert capped.mfu < base.mfu


@pytest.mark.parametrize("kwargs,needle", [
    (dict(memory="24"), "needs a unit"),
    (dict(memory="24 GiBs"), "did you mean"),
    (dict(memory="-24GiB"), "must be positive"),
    (dict(memory="lots"), "cannot read"),
    (dict(hbm_bandwidth="2.4TB"), "2.4TB/s"),
    (dict(hbm_bandwidth="fast"), "2.4TB/s"),
    (dict(power_limit="500"), "500W"),
    (dict(power_limit="0W"), "must be positive"),
])
def test_bad_units_are_one_line(kwargs, needle):
    with pytest.raises(TrainfitError) as e:
        device("h100", **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_power_limit_needs_a_tdp_and_a_device_needs_something():
    with pytest.raises(TrainfitError, match="TDP"):
        device("tpu-v5e", power_limit="100W")
    with pytest.raises(TrainfitError, match="--memory"):
        device()


def _one_line_error(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("trainfit: error:"), r.stderr
    return lines[0]


def test_cli_memory_alone_and_on_top_of_a_device():
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "--memory", "24GiB", "--method", "first-order"])
    assert r.exit_code == 0, r.output
    assert "generic device [memory 24 GiB" in r.stdout and "(24 GiB)" in r.stdout
    args = ["estimate", "llama-3.1-8b", "h100", "--method", "first-order", "--batch", "64", "--seq", "2048",
            "--dp", "8", "--zero", "3", "--checkpointing", "selective"]  # FIT
    assert "DOES NOT FIT" in runner.invoke(app, args).stdout
    r = runner.invoke(app, args + ["--memory", "96GiB", "--power-limit", "500W"])
    assert r.exit_code == 0, r.output
    assert "NVIDIA H100 [memory 96 GiB, power limit 500 W (compute x0.894 of 700 W)]" in r.stdout.replace("\n", "")
    assert "DOES NOT FIT" not in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--memory", "24"], "needs a unit"),
    (["--hbm-bandwidth", "2.4 TB"], "2.4TB/s"),
    (["--power-limit", "500 watts"], "500W"),
])
def test_cli_bad_units_are_one_line(args, needle):
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "h100", "--method", "first-order", *args])
    assert needle in _one_line_error(r)


def test_cli_needs_a_device_or_memory_and_frontier_takes_memory():
    assert "--memory" in _one_line_error(runner.invoke(app, ["estimate", "llama-3.1-8b"]))
    r = runner.invoke(app, ["frontier", "gpt2", "--memory", "24GiB", "--over", "batch", "--seq", "1024",
                            "--method", "first-order"])
    assert r.exit_code == 0, r.output
    assert "generic device" in r.stdout


def test_the_datasheet_peak_survives_a_power_limit():
    d = device("h100", power_limit="500W")
    assert d.spec.compute_scale == pytest.approx((500 / 700) ** (1 / 3))
    assert d.spec.datasheet_flops("bf16") == pytest.approx(989e12)  # MFU's denominator as the sources define it
    assert H100.datasheet_flops("bf16") == 989e12 and H100.compute_scale == 1.0
    # a second limit replaces the first (from the datasheet peaks), it does not compound
    twice = device(d, power_limit="350W", memory="96GiB")
    assert twice.spec.compute_scale == pytest.approx((350 / 700) ** (1 / 3))
    assert twice.spec.flops("bf16") == pytest.approx(989e12 * (350 / 700) ** (1 / 3))
    assert twice.name.count("power limit") == 1 and "350 W" in twice.name and "memory 96 GiB" in twice.name


def test_measure_judges_the_fit_on_a_memory_alone():
    """`trainfit measure --memory` (optional there): the measured peak against the stated capacity."""
    import json
    from pathlib import Path

    pytest.importorskip("torch")
    tiny = str(Path(__file__).resolve().parent / "data" / "groundtruth" / "configs" / "gpt2-tiny.json")
    r = runner.invoke(app, ["measure", tiny, "--batch", "2", "--seq", "64", "--memory", "1MiB", "--output", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["available_bytes"] == 2**20 and d["feasible"] is False  # GPT-2 tiny's fp32 weights alone exceed 1 MiB


def test_plan_ranks_layouts_on_the_capped_device():
    import json

    args = ["plan", "llama-3.1-8b", "--hardware", "h100", "--gpus", "8", "--top", "1", "--output", "json", "--stack",
            "megatron"]
    base = runner.invoke(app, args)
    capped = runner.invoke(app, args + ["--power-limit", "500W", "--memory", "96GiB"])
    assert base.exit_code == 0 and capped.exit_code == 0, capped.output
    b, c = json.loads(base.stdout), json.loads(capped.stdout)
    assert c["capacity_bytes"] == 96 * GiB and b["capacity_bytes"] == 80 * GiB
    assert c["hardware"].startswith("NVIDIA H100 [memory 96 GiB, power limit 500 W")
    assert c["top"][0]["step_time"]["seconds"] > b["top"][0]["step_time"]["seconds"]  # compute capped, same model


def test_a_sweep_takes_overridden_and_memory_only_devices():
    r = trainfit.sweep("llama-3.1-8b", ["h100", device("h100", memory="96GiB"), "24GiB"], method="first-order",
                       **FIT)
    assert list(r.arrays["available_bytes"] / GiB) == [80, 96, 24]
    assert list(r.arrays["feasible"]) == [False, True, False]  # 89.17 GB fits 96 GiB only
