"""Catalogs: every upstream entry present with its figures; lookup by key, qualified key, name or slug."""
from __future__ import annotations

import pytest

from trainfit.catalog import Catalog, HardwareSpec, Hardware, Models
from trainfit.datafile import validate_entries
from trainfit.errors import TrainfitError
from trainfit.units import GB, GiB

# upstream.md §2.2: the hardware keys of the MLSys·im registry.
UPSTREAM_HARDWARE = {
    "cloud": ["V100", "V100_PCIe", "A100", "H100", "H200", "B200", "GB200_NVL72", "MI300X", "MI250X", "Gaudi2", "Gaudi3",
              "Trainium2", "TPUv1", "TPUv2", "TPUv3", "TPUv4", "TPUv5p", "TPUv6", "Cerebras_CS3", "Groq_LPU",
              "Graphcore_GC200", "DMatrix_Corsair", "Untether_speedAI240", "IntelSGX", "ReferenceCPU"],
    "workstation": ["DGX_Spark", "MacBookM3Max"],
    "mobile": ["iPhone15Pro", "Pixel8", "Snapdragon8Gen3", "AppleM2"],
    "edge": ["JetsonAGXOrin", "JetsonOrinNX", "JetsonOrinNano", "Coral", "NUC_Movidius", "GenericServer", "RoboTaxi",
             "DriveThor"],
    "tiny": ["ESP32_S3", "nRF52840", "HimaxWE1", "OuraRing", "LockstepSafetyMCU_Reference"],
}

# upstream.md §3.2 model keys.
UPSTREAM_MODELS = ["BERT_Base", "BERT_Large", "GPT2_Small", "GPT2", "GPT3", "GPT4", "Llama2_7B", "Llama2_70B", "Llama3_8B",
                   "Llama3_70B", "Llama3_405B", "Mixtral_8x7B", "DeepSeek_V3", "AlexNet", "ResNet18", "ResNet50",
                   "MobileNetV2", "MobileNetV2_Alpha0_5", "MobileNetV2_Alpha0_5FeatureExtractor", "EfficientNetB0",
                   "YOLOv8_Nano", "LeNet1", "DS_CNN", "WakeVision", "AnomalyDetector", "Mamba_130M", "Mamba_2_8B",
                   "StableDiffusion_v1_5", "DLRM"]


def test_every_upstream_hardware_entry_is_present_in_its_tier():
    assert len(Hardware) >= 44
    for tier, keys in UPSTREAM_HARDWARE.items():
        have = {h.key for h in Hardware.select(tier)}
        assert set(keys) <= have, (tier, set(keys) - have)


def test_every_upstream_model_entry_is_present():
    have = {m.key for m in Models}
    assert set(UPSTREAM_MODELS) <= have, set(UPSTREAM_MODELS) - have


@pytest.mark.parametrize("key,capacity", [
    # upstream.md §2.2 (and mlsysim 0.3.0 data); capacities in their stated unit.
    ("H100", 80 * GiB), ("A100", 80 * GiB), ("V100", 32 * GiB), ("MI300X", 192 * GiB), ("TPUv5p", 95 * GiB),
    ("iPhone15Pro", 8 * GiB), ("OuraRing", 2 * 2**20), ("RoboTaxi", 32 * GiB), ("GB200_NVL72", 13.5 * 2**40),
])
def test_hardware_capacities(key, capacity):
    assert Hardware.get(key).memory.capacity == capacity


def test_h100_figures_and_links():
    h = Hardware.Cloud.H100
    assert h.memory.capacity / GB == pytest.approx(85.89934592)  # upstream.md §5
    assert h.memory.bandwidth == pytest.approx(3.35e12)
    assert h.compute.peak_flops == pytest.approx(989e12) and h.flops("fp8") == pytest.approx(1979e12)
    assert h.tdp == 700
    assert h.nvlink.bandwidth_per_direction == pytest.approx(450e9)  # 900 GB/s bidirectional total
    assert h.source.kind == "datasheet" and h.source.ref


@pytest.mark.parametrize("name", ["h100", "H100", "Cloud.H100", "Hardware.Cloud.H100", "NVIDIA H100", "nvidia-h100",
                                  "  h100 "])
def test_hardware_lookup_forms(name):
    assert Hardware.get(name).key == "H100"


@pytest.mark.parametrize("name", ["llama-3.1-8b", "Language.Llama3_8B", "Models.Language.Llama3_8B", "Llama-3.1-8B",
                                  "LLAMA3_8B"])
def test_model_lookup_forms(name):
    m = Models.get(name)
    assert m.key == "Llama3_8B" and m.parameters == 8.03e9 and m.layers == 32 and m.hidden_dim == 4096
    assert m.heads == 32 and m.kv_heads == 8


def test_attribute_access_like_upstream():
    assert Hardware.Cloud.H100.name == "NVIDIA H100"
    assert Models.Language.Mixtral_8x7B.experts == 8
    with pytest.raises(TrainfitError, match="H1000"):
        Hardware.Cloud.H1000


def test_unknown_name_suggests_close_matches():
    with pytest.raises(TrainfitError) as e:
        Hardware.get("h1000")
    assert "did you mean" in str(e.value) and "h100" in str(e.value)
    with pytest.raises(TrainfitError) as e:
        Models.get("llama-3.1-9b")
    assert "Llama-3.1-8B" in str(e.value)


def test_names_are_unique_across_each_catalog():
    # Building the catalog rejects a name that two entries share; assert it actually checks.
    h = Hardware.get("h100")
    dup = h.model_copy(update={"key": "H100_copy", "slug": "h100-copy"})  # same display name
    with pytest.raises(TrainfitError, match="used by both"):
        Catalog("hardware", "Hardware", [h, dup])


def test_bad_hardware_data_points_at_file_line_and_key(tmp_path):
    import yaml
    from trainfit.datafile import load_entries
    bad = tmp_path / "hw.yaml"
    bad.write_text(yaml.safe_dump([{
        "key": "X1", "tier": "cloud", "platform": "cuda", "name": "X One", "slug": "x1",
        "memory": {"capacity": "80 GiBs", "bandwidth": "1 TB/s"},
        "compute": {"peak_flops": "1 TFLOP/s"}, "source": {"kind": "estimate", "ref": "test"}}]))
    with pytest.raises(TrainfitError) as e:
        load_entries(bad, HardwareSpec, what="hardware")
    msg = str(e.value)
    assert str(bad) in msg and "line" in msg and "memory.capacity" in msg and "\n" not in msg


def test_unknown_field_is_rejected():
    with pytest.raises(TrainfitError, match="unknown field"):
        validate_entries("x.yaml", [{"key": "X", "tier": "cloud", "platform": "cuda", "name": "X", "slug": "x", "colour": "red",
                                     "memory": {"capacity": 1, "bandwidth": 1}, "compute": {"peak_flops": 1},
                                     "source": {"kind": "estimate", "ref": "r"}}], None, HardwareSpec, what="hardware")


def test_gib_display_matches_sold_size():
    assert Hardware.get("a100").memory.capacity / GiB == 80
