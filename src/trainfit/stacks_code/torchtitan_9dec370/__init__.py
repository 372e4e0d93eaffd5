"""torchtitan's Llama model, its activation-checkpoint and FSDP2/TP parallelisation and its loss and step, from
https://github.com/pytorch/torchtitan at commit 9dec370ad26b5f8e9a7333a0e36165018262644b (2024-12-26), the
code of torchtitan's Llama 3.1 8B H100 benchmark. BSD-3-Clause, Copyright 2024 Meta (LICENSE). Each file's
header says what was changed (the Triton fused RMSNorm dropped, torchtitan's config plumbing left out).
torchtitan 0.3.0 on PyPI is a different program (flex attention, fused QKV, chunked loss).

Importing this package needs torch; :mod:`trainfit.measure.stacks.torchtitan` imports it lazily.
"""
COMMIT = "9dec370ad26b5f8e9a7333a0e36165018262644b"
SOURCE = "https://github.com/pytorch/torchtitan/tree/" + COMMIT
