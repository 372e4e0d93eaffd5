"""Which blocks of a model repeat alike, so that a few of them can stand for all.

Each block of the model's layer stack gets a signature: its module tree (class names, parameter shapes,
dtypes, whether they train) and every plain setting its modules hold (attention type, window, whether
rotary embeddings apply ...), leaving out the block's own index. :func:`repeat_plan` then finds a
prefix, a unit of ``period`` blocks repeated ``units`` times, and a suffix, with the first and last
blocks kept apart (the first block's input needs no gradient under LoRA; the last feeds the final norm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

_INDEX_WORDS = ("idx", "index", "layer_id", "layer_num", "block_id")


def _plain_settings(module: Any) -> list[tuple[str, Any]]:
    out = []
    for k, v in vars(module).items():
        if k.startswith("_") or k == "training" or any(w in k.lower() for w in _INDEX_WORDS):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out.append((k, v))
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str)) for x in v) and len(v) < 64:
            out.append((k, tuple(v)))
    return sorted(out)


def block_signature(block: Any) -> str:
    """What makes two blocks allocate alike (see the module docstring)."""
    parts = []
    for name, mod in block.named_modules():
        params = sorted((n, tuple(p.shape), str(p.dtype), bool(p.requires_grad))
                        for n, p in mod.named_parameters(recurse=False))
        buffers = sorted((n, tuple(b.shape), str(b.dtype)) for n, b in mod.named_buffers(recurse=False))
        parts.append(repr((name, type(mod).__name__, params, buffers, _plain_settings(mod))))
    return "\n".join(parts)


@dataclass(frozen=True)
class RepeatPlan:
    """Blocks ``[0, prefix)``, then ``units`` copies of the ``period`` blocks from ``prefix`` on, then the last
    ``suffix`` blocks."""

    n_layers: int
    prefix: int
    period: int
    units: int
    suffix: int

    def keep(self, units: int) -> list[int]:
        """Block indices of a model with ``units`` repeated units (and the same prefix and suffix)."""
        core = list(range(self.prefix, self.prefix + units * self.period))
        tail = list(range(self.n_layers - self.suffix, self.n_layers))
        return list(range(self.prefix)) + core + tail

    def depth(self, units: int) -> int:
        return self.prefix + units * self.period + self.suffix


def repeat_plan(signatures: Sequence[str], min_units: int = 4) -> Optional[RepeatPlan]:
    """The cheapest prefix/unit/suffix split (fewest blocks in a two-unit model) with the first and the last
    block outside the repeated units and at least ``min_units`` units; None when there is none or when the
    one-unit model would be more than three quarters as deep as the full one."""
    ids: dict[str, int] = {}
    seq = [ids.setdefault(s, len(ids)) for s in signatures]
    n = len(seq)
    best: Optional[RepeatPlan] = None
    for period in range(1, n // min_units + 1):
        for prefix in range(1, n - period * min_units):
            unit = seq[prefix:prefix + period]
            units = 0
            while prefix + (units + 1) * period <= n - 1 and seq[prefix + units * period:prefix + (units + 1) * period] == unit:
                units += 1
            suffix = n - prefix - units * period
            if units < min_units or suffix < 1:
                continue
            plan = RepeatPlan(n, prefix, period, units, suffix)
            if best is None or plan.depth(2) < best.depth(2):
                best = plan
    # worth it only when the one-unit model is well short of the full one (the charting runs on it; else the
    # full model is traced, which then needs no extension)
    return best if best is not None and 4 * best.depth(1) <= 3 * n else None


__all__ = ["RepeatPlan", "block_signature", "repeat_plan"]
