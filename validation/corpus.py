"""Reading measured training steps (``tests/data/groundtruth/dev-cases.jsonl``, the ``trainfit
measure`` corpus ``validation/corpus-measured.jsonl``) into the detailed method's inputs, so tests
and the validation report compare like with like. Used by tests and validation only (not part of the
installed package)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator, Optional

from trainfit.arch import ArchSpec, arch_from_config, load_config
from trainfit.training_setup import PARALLEL_FIELDS, TrainingSetup

_RAISED = re.compile(r"(\w+) raised from \d+ to (\d+)")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a .jsonl file (blank lines skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def case_config(case: dict[str, Any], configs_dir: Optional[Path] = None, base_dir: Optional[Path] = None) -> dict[str, Any]:
    """The config dict a case was measured with (position tables enlarged as its notes say): the case's
    own ``config``, ``configs_dir/<model>.json``, a ``.json`` path relative to ``base_dir`` (the corpus
    file's folder), or a bundled config name."""
    if isinstance(case.get("config"), dict):
        cfg = dict(case["config"])
    else:
        name = str(case.get("model") or case.get("inputs", {}).get("model"))
        candidates = [configs_dir / f"{name}.json"] if configs_dir is not None else []
        if name.endswith(".json") and base_dir is not None:
            candidates.append(base_dir / name)
        path = next((p for p in candidates if p.is_file()), None)
        cfg = json.loads(path.read_text()) if path is not None else load_config(name)
    notes = list(case.get("notes") or []) + list(case.get("build_notes") or [])
    for note in notes:
        m = _RAISED.search(str(note))
        if m:
            cfg[m.group(1)] = int(m.group(2))
    return cfg


def case_arch(case: dict[str, Any], configs_dir: Optional[Path] = None, base_dir: Optional[Path] = None) -> ArchSpec:
    return arch_from_config(case_config(case, configs_dir, base_dir), name=str(case.get("model", "config")))


def case_setup(case: dict[str, Any], arch: ArchSpec) -> TrainingSetup:
    """The training setup of a measured case: the field names of dev-cases.jsonl (``batch``, ``seq``,
    ``ckpt``, ``lora_r``, ``attn_implementation``) or of a ``trainfit measure`` JSON echo (whose parallel
    fields and accumulation, when present, describe a multi-GPU rank)."""
    inputs = case.get("inputs") or {}
    get = lambda *keys, default=None: next((src[k] for k in keys for src in (case, inputs) if k in src), default)  # noqa: E731
    ck = get("checkpointing", default="full" if case.get("ckpt") else "none")
    attn = str(get("attention", "attn", "attn_implementation", default="sdpa"))
    lora = int(get("lora_rank", "lora_r", default=0) or 0)
    targets = tuple(get("lora_targets", default=None) or ("q_proj", "v_proj"))
    layout = {k: (tuple(v) if isinstance(v, list) else v) for k in (*PARALLEL_FIELDS, "accumulation")
              if (v := get(k)) is not None}
    return TrainingSetup.build(arch, batch=int(get("batch")), seq_len=int(get("seq_len", "seq")), **layout,
                               precision=get("precision"), optimizer=get("optimizer"),
                               opt_impl=get("opt_impl", default="foreach"), checkpointing=ck,
                               attention="auto" if attn == "sdpa" else attn, dropout=bool(get("dropout", default=True)),
                               lora_rank=lora, lora_targets=targets)


def single_gpu(case: dict[str, Any]) -> bool:
    """Whether a case ran on one GPU (every dev case does; multi-GPU cases name a world size)."""
    return int(case.get("world_size", 1) or 1) == 1


def parallel_kind(case: dict[str, Any]) -> str:
    """The parallelism a multi-GPU case exercises; the report and the tests group errors by it."""
    if case.get("cp", 1) > 1:
        return "cp"
    if case.get("ep", 1) > 1:
        return "ep"
    if case["pp"] > 1:
        if case["dp"] > 1:
            return "pipeline x ddp"
        if case["tp"] > 1:
            return "pipeline x tp"
        return "pipeline (interleaved)" if case.get("pp_schedule") == "interleaved" else "pipeline"
    if case["tp"] > 1 and case["dp"] > 1:
        return "fsdp x tp"
    if case["tp"] > 1:
        return "tp"
    if case["fsdp"]:
        return "fsdp" if case["reshard_after_forward"] else "fsdp (no reshard)"
    return "ddp"


def iter_cases(path: Path, configs_dir: Optional[Path] = None) -> Iterator[tuple[dict[str, Any], ArchSpec, TrainingSetup]]:
    for case in read_jsonl(path):
        arch = case_arch(case, configs_dir, path.parent)
        yield case, arch, case_setup(case, arch)
