"""The traced method: a model's training step recorded on fake tensors at a few shapes, every allocation's
size fitted as a polynomial in (batch, seq), and the peak of any shape evaluated from the fitted timeline.

* :mod:`.record` — recording steps (the measured method's step, CUDA emulations and tracker);
* :mod:`.fit` — exact polynomial sizes; :mod:`.window` — steps as size-change streams, repeated blocks;
* :mod:`.layers` — which blocks repeat alike; :mod:`.trace` — regimes, fitting, extension, verification;
* :mod:`.timeline` — the compiled timeline and its vectorised evaluation; :mod:`.cache` — on disk;
* :mod:`.method` — :class:`Traced`, the memory method.

Needs the ``measure`` extra to trace; a cached timeline is evaluated with numpy alone.
"""
from .method import ACCEPTS, COMPONENTS, NAME, StderrProgress, Timeline, Traced, timeline

__all__ = ["ACCEPTS", "COMPONENTS", "NAME", "StderrProgress", "Timeline", "Traced", "timeline"]
