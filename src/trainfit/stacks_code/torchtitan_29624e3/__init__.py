"""torchtitan's Qwen3 model (dense and mixture-of-experts), its shared MoE layer (token-choice top-k router,
grouped experts on ``torch._grouped_mm`` with the padded permutation to a static upper bound, shared experts,
expert-bias load balancing), its activation-checkpoint and FSDP2 wrapping for Qwen3 and its loss and step, from
https://github.com/pytorch/torchtitan at tag v0.2.0, commit 29624e37fa6dd319fd671b009338651b5c665da2
(2025-10-17). BSD-3-Clause, (c) Meta Platforms, Inc. and affiliates (LICENSE). Each file's header says what was
changed: the Triton kernel that fills the permutation indices replaced by a torch fallback writing the same
output, flex attention and torchtitan's config plumbing (JobConfig, ParallelDims, logging) left out.

torchtitan's Llama stays at commit 9dec370 (:mod:`trainfit.stacks_code.torchtitan_9dec370`), the code of its
2024-12 H100 benchmark; this package is only its MoE model.

Importing this package needs torch; :mod:`trainfit.measure.stacks.torchtitan` imports it lazily.
"""
COMMIT = "29624e37fa6dd319fd671b009338651b5c665da2"
TAG = "v0.2.0"
SOURCE = "https://github.com/pytorch/torchtitan/tree/" + COMMIT
