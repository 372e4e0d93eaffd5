"""The hardware people fine-tune on: every entry loads with its source, dense peaks, aliases people type."""
from __future__ import annotations

import pytest

from trainfit.catalog import Hardware
from trainfit.errors import TrainfitError
from trainfit.units import GB, GiB

#: the entries added beyond the MLSys·im seed (kept in the seed's parity test out of the oracle's reach)
ADDED = ["RTX3060_12GB", "RTX3090", "RTX4060Ti_16GB", "RTX4070TiSuper", "RTX4080", "RTX4090", "RTX5080", "RTX5090",
         "RTX_A4000", "RTX_A5000", "RTX_A6000", "RTX6000_Ada", "RTXPro6000_Blackwell", "L4", "L40S", "A10G",
         "A100_PCIe_80GB", "A100_PCIe_40GB", "H100_NVL", "H20", "GH200", "GH200_144GB", "B300", "GB200", "MI355X",
         "TPUv5e", "M2_Max", "M2_Ultra", "M3_Max", "M3_Ultra", "M4_Max"]
#: the list people asked for, each by a name they type -> the entry it must reach
ASKED = {"rtx-3060-12gb": "RTX3060_12GB", "3090": "RTX3090", "rtx-4060-ti-16gb": "RTX4060Ti_16GB",
         "4070-ti-super": "RTX4070TiSuper", "4080": "RTX4080", "4090": "RTX4090", "rtx4090": "RTX4090",
         "rtx-4090": "RTX4090", "RTX 4090": "RTX4090", "5080": "RTX5080", "5090": "RTX5090", "a4000": "RTX_A4000",
         "a5000": "RTX_A5000", "a6000": "RTX_A6000", "rtx-6000-ada": "RTX6000_Ada",
         "rtx-pro-6000-blackwell": "RTXPro6000_Blackwell", "t4": "T4", "tesla-t4": "T4", "l4": "L4", "l40s": "L40S",
         "a10g": "A10G", "a100-80gb": "A100", "a100-sxm4-80gb": "A100", "a100-40gb": "A100_40GB",
         "a100-sxm4-40gb": "A100_40GB", "a100-pcie": "A100_PCIe_80GB", "a100-pcie-40gb": "A100_PCIe_40GB",
         "h100-sxm": "H100", "h100-sxm5": "H100", "h100-pcie": "H100_PCIe", "h100-nvl": "H100_NVL", "h200": "H200",
         "h20": "H20", "gh200": "GH200", "b200": "B200", "b300": "B300", "gb200": "GB200", "mi250x": "MI250X",
         "mi300x": "MI300X", "mi325x": "MI325X", "mi355x": "MI355X", "gaudi2": "Gaudi2", "gaudi3": "Gaudi3",
         "tpu-v5e": "TPUv5e", "tpu-v5p": "TPUv5p", "tpu-v6e": "TPUv6", "trillium": "TPUv6", "m2-max": "M2_Max",
         "m2-ultra": "M2_Ultra", "m3-max": "M3_Max", "m3-ultra": "M3_Ultra", "m4-max": "M4_Max"}


@pytest.mark.parametrize("key", ADDED)
def test_every_added_entry_loads_with_a_source_and_sane_figures(key):
    h = Hardware.get(key)
    assert h.key == key and h.source.ref and h.source.url and h.source.url.startswith("https://")
    assert 8 * GiB <= h.memory.capacity <= 400 * GiB
    assert 100 * GB <= h.memory.bandwidth <= 10_000 * GB  # GDDR6 of a 4060 Ti to HBM3e
    assert h.flops("bf16") == h.compute.peak_flops  # bf16 is the default peak (tensor cores, sm_80+)
    if h.platform == "cuda":
        assert h.compute_capability is not None and h.sm >= 80


@pytest.mark.parametrize("name,key", sorted(ASKED.items()))
def test_the_names_people_type_resolve(name, key):
    assert Hardware.get(name).key == key


@pytest.mark.parametrize("key", [k for k in ADDED if Hardware.get(k).platform == "cuda"])
def test_nvidia_peaks_are_dense(key):
    """Dense fp8 is twice dense fp16/bf16 and dense tf32 half of it on every tensor-core generation listed
    (NVIDIA Ampere/Ada/Hopper/Blackwell whitepapers); a datasheet's sparsity figure copied unhalved breaks that
    ratio against the fp32-derived or dense figures beside it."""
    h = Hardware.get(key)
    table = h.compute.precision_flops
    if "fp8" in table:
        assert table["fp8"] == pytest.approx(2 * h.compute.peak_flops, rel=0.01)
    if "tf32" in table:
        assert table["tf32"] == pytest.approx(h.compute.peak_flops / 2, rel=0.01)
    assert table["fp32"] < h.compute.peak_flops


@pytest.mark.parametrize("key,capacity,bandwidth,bf16", [
    # NVIDIA Ada whitepaper App. A: RTX 4090 24 GB, 1008 GB/s, FP16/BF16 tensor FP32-accumulate 165.2 dense
    ("RTX4090", 24 * GiB, 1008e9, 165.2e12),
    # NVIDIA GA102 whitepaper Table 9: RTX 3090 24 GB, 936 GB/s, 71 dense (142 sparse)
    ("RTX3090", 24 * GiB, 936e9, 71e12),
    # NVIDIA L40S datasheet: 48 GB, 864 GB/s, 733 TFLOPS bf16 with sparsity -> 366 dense
    ("L40S", 48 * GiB, 864e9, 366e12),
    # NVIDIA H100 datasheet, NVL column: 94 GB, 3.9 TB/s, 1671 sparse -> 835 dense
    ("H100_NVL", 94 * GiB, 3.9e12, 835e12),
    # NVIDIA A100 datasheet, 80GB PCIe: 1935 GB/s, 312 dense
    ("A100_PCIe_80GB", 80 * GiB, 1935e9, 312e12),
    # AMD MI355X datasheet: 288 GB HBM3E, 8 TB/s, 2.5 PFLOPS dense fp16
    ("MI355X", 288 * GiB, 8e12, 2516.6e12),
])
def test_datasheet_figures(key, capacity, bandwidth, bf16):
    h = Hardware.get(key)
    assert h.memory.capacity == capacity and h.memory.bandwidth == pytest.approx(bandwidth)
    assert h.flops("bf16") == pytest.approx(bf16)


@pytest.mark.parametrize("key,ram_gb", [("M2_Max", 96), ("M2_Ultra", 192), ("M3_Max", 128), ("M3_Ultra", 512),
                                        ("M4_Max", 128)])
def test_apple_entries_hold_the_gpu_share_of_unified_memory(key, ram_gb):
    # macOS's recommendedMaxWorkingSetSize: about 75 % of RAM on machines above 36 GB
    h = Hardware.get(key)
    assert h.platform == "apple" and h.memory.capacity == 0.75 * ram_gb * GiB
    assert "recommendedMaxWorkingSetSize" in h.source.ref


def test_the_seed_m3_max_entry_keeps_its_whole_memory():
    assert Hardware.get("MacBookM3Max").memory.capacity == 128 * GiB


def test_a_typo_gets_the_close_match():
    with pytest.raises(TrainfitError) as e:
        Hardware.get("rtx4900")
    msg = str(e.value)
    assert "did you mean" in msg and "rtx-4090" in msg and "\n" not in msg


def test_docs_list_every_cloud_and_workstation_entry():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text()
    missing = [h.key for h in Hardware if h.tier in ("cloud", "workstation") and f"| {h.key} |" not in text]
    assert not missing, f"docs/hardware.md lacks {missing}"
