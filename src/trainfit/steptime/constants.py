"""Every constant of the step-time model, with its meaning and its source.

Two kinds: **facts** taken from a document (a library's source, a vendor guide, a paper) and
**efficiencies** — the fraction of a rated peak a kind of kernel reaches. The efficiencies are the
same for every model, layout and row of ``validation/steptime.md``; they are not tuned per row. One figure is
calibrated, and only on the calibration rows of that report's corpus (the 2nd, 4th, ... predicted row of each
source): the Hopper GEMM share in ``data/efficiency.yaml`` (0.66, the value whose median ratio of predicted to
published step time over the Hopper calibration rows is closest to 1). Everything here is taken from its source
or, where marked, a physical estimate (:data:`OVERLAPPED_COMM_SLOWDOWN`); none is fitted.
Hardware figures (peak FLOP/s, HBM and link bandwidths, SM counts, NICs) live in the hardware
catalog (``data/hardware.yaml``), not here.
"""
from __future__ import annotations

# --------------------------------------------------------------------------- kernels (efficiencies)

#: Fraction of the dense tensor-core peak a large, well-shaped GEMM sustains (cuBLAS/cuBLASLt, 16-bit
#: inputs, fp32 accumulation). NVIDIA's A100 and H100 GEMM benchmarks put large square GEMMs at
#: 80-90 % of the datasheet peak (A100: about 250-280 of 312 TFLOP/s); clock throttling under
#: sustained training load costs a few percent more. Shape losses come on top (wave quantisation,
#: memory-bound thin GEMMs), see :data:`GEMM_TILE` and :data:`EXPECTED_TAIL_WAVES`.
GEMM_EFFICIENCY = 0.80

#: Output tile of one thread block of a large cuBLAS tensor-core GEMM (rows x columns): 256 x 128,
#: the tile NVIDIA's "Matrix Multiplication Background User's Guide" (Deep Learning Performance
#: documentation, "Tile quantization" and "Wave quantization") uses for A100 fp16 examples.
GEMM_TILE = (256, 128)

#: A GEMM's tiles run in waves of one tile per SM; the last wave is on average half full
#: (wave quantisation, same guide), so ``waves / (waves + 0.5)`` of the SMs do useful work on average.
EXPECTED_TAIL_WAVES = 0.5

#: Fraction of HBM bandwidth that memory-bound kernels (norms, activations, softmax, dropout,
#: residual adds, optimizer updates) sustain. STREAM-like copy kernels reach about 80-90 % of the
#: rated HBM bandwidth on A100/H100 (NVIDIA's "GPU Performance Background User's Guide" treats
#: element-wise ops as memory-bound at the achievable, not the rated, bandwidth).
HBM_EFFICIENCY = 0.80

#: Fraction of the tensor-core peak FlashAttention-2 sustains, forward and backward: Dao (2023),
#: "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", reaches 50-73 %
#: of the theoretical maximum FLOP/s on A100; we take 0.60. FlashAttention's backward does 2.5x the
#: forward's matmul FLOPs (it recomputes the scores): :data:`FLASH_BACKWARD_FLOPS`.
FLASH_EFFICIENCY = 0.60
FLASH_BACKWARD_FLOPS = 2.5

#: Backward of a memory-bound op moves about twice its forward's bytes: it reads the saved input(s)
#: and the output gradient and writes the input gradient (PyTorch ``derivatives.yaml`` formulas).
BACKWARD_TRAFFIC = 2.0

#: Bytes moved per attention score by the eager/math kernel's fused scale-mask-softmax (read 2, write 2)
#: and, with dropout, the dropout on the probabilities (read 2, write 2, a 1-byte mask):
#: Megatron-LM ``FusedScaleMaskSoftmax`` and ``torch.nn.functional.dropout``.
SOFTMAX_BYTES_PER_SCORE = 4.0
DROPOUT_BYTES_PER_ELEMENT_16 = 5.0

#: Bytes moved per logit by the loss in the forward: the logits read, their fp32 upcast written and
#: read, the log-softmax written and read (transformers ``ForCausalLMLoss``: ``logits.float()`` then
#: cross-entropy); the backward moves :data:`BACKWARD_TRAFFIC` times as much.
LOSS_BYTES_PER_LOGIT = 14.0

#: Elements an element-wise op moves per element of its output in the forward: it reads its input and
#: writes its output (norms, rotary, the embedding gather, a copy) — the roofline of NVIDIA's "GPU
#: Performance Background User's Guide" ("Understanding Performance": element-wise operations are
#: memory-bound, bytes read + bytes written). Multiplies the element width (``compute_bytes``).
READ_WRITE = 2.0

#: Elements the two residual adds of a transformer block move per residual-stream element: each add
#: reads two tensors and writes one (2 x 3 = 6; Vaswani et al. 2017 §3.1: ``x + Sublayer(x)`` after
#: attention and after the MLP). This model's count; multiplies ``compute_bytes``.
RESIDUAL_TRAFFIC = 6.0

#: Hidden-state dropouts per block (after attention and after the MLP, as transformers' decoders apply
#: ``hidden_dropout``/``resid_pdrop``); each reads and writes the activation and writes a 1-byte mask
#: (:data:`DROPOUT_MASK_BYTES`, ``torch.nn.functional.dropout``'s bool mask).
HIDDEN_DROPOUTS_PER_BLOCK = 2
DROPOUT_MASK_BYTES = 1

#: Elements the MLP's activation moves per intermediate element: a gated MLP (SwiGLU/GeGLU, Shazeer
#: 2020) reads the gate and the up projection and writes their product (3); a plain MLP reads and
#: writes one (:data:`READ_WRITE`).
GATED_ACTIVATION_TRAFFIC = 3.0

#: Eager PyTorch runs a composite RMSNorm as one kernel per operation (transformers ``LlamaRMSNorm``,
#: torchtitan's ``RMSNorm``: ``x.float()``, ``pow(2)``, ``mean``, ``* rsqrt``, ``.to(bf16)``, ``* weight``);
#: per element of a 16-bit input that is 6 + 8 + 4 + 8 + 6 + 4 = 36 bytes read and written = 18 elements
#: of the 2-byte width, against :data:`READ_WRITE` (2) for a fused kernel (apex/TE/Liger, or
#: ``torch.compile``, which fuses the chain into one pass). LayerNorm is one native kernel even in eager
#: (``aten::native_layer_norm``), so it keeps :data:`READ_WRITE`. Multiplies ``compute_bytes``.
EAGER_RMSNORM_TRAFFIC = 18.0

#: Eager rotary embedding per rotated element: transformers' ``apply_rotary_pos_emb`` computes
#: ``q * cos + rotate_half(q) * sin`` as five kernels (``neg`` on half, ``cat``, two ``mul``, one ``add``):
#: 2 + 4 + 6 + 6 + 6 = 24 bytes at 16 bits = 12 elements (torchtitan's complex multiply with fp32 upcasts
#: moves about as much); fused (compiled, Megatron/TE fused RoPE): read and write once, :data:`READ_WRITE`.
EAGER_ROTARY_TRAFFIC = 12.0

#: Eager gated activation per intermediate element: ``act(gate)`` (read, write) then ``* up`` (read two,
#: write one) = 5 elements, against :data:`GATED_ACTIVATION_TRAFFIC` (3) when fused.
EAGER_GATED_ACTIVATION_TRAFFIC = 5.0

#: Bytes a QLoRA forward or input-gradient GEMM moves per frozen weight element to dequantise it, on top
#: of writing it at the compute width: bitsandbytes ``dequantize_4bit`` reads the packed NF4 weight (0.5
#: byte) and its absmax (one fp32 per 64-element block, double-quantised to 8 bits: ~0.016 byte, not
#: counted) and writes the 16-bit weight; int8 reads one byte (Dettmers et al. 2023, "QLoRA", §3).
DEQUANT_BYTES = {"nf4": 0.5, "int8": 1.0}

#: FSDP2 / ZeRO-3 copies per block and micro-batch, on the compute stream: each all-gathered block is
#: copied out of the flat gather buffer into its parameters (``split_with_sizes_copy``: read and write
#: the block at the parameter width), once for the forward and once for the backward, and the
#: block's gradients are copied into the reduce-scatter buffer (``torch._chunk_cat``: read and write)
#: (PyTorch ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``).
FSDP_COPY_PASSES = 2.0

#: fp8 training with dynamic per-tensor scaling (torchao ``Float8Linear``, Transformer Engine): every GEMM
#: operand is scaled and cast from 16 bits to fp8 — an amax pass (read 2 bytes per element) and the cast
#: (read 2, write 1) = 5 bytes per element eager; compiled, the amax fuses into the producer (3 bytes). The
#: weight-gradient and input-gradient GEMMs also need transposed fp8 copies on Hopper (fp8 tensor cores
#: take K-major operands only: read 1, write 1 = 2 bytes). Per element of the input, the weight, the
#: output gradient (casts) and of the input, weight and output gradient (transposes).
FP8_CAST_BYTES = 5.0
FP8_CAST_BYTES_COMPILED = 3.0
FP8_TRANSPOSE_BYTES = 2.0

#: Host time per kernel launch: eager PyTorch pays Python, the dispatcher, autograd bookkeeping and the CUDA
#: launch for every operator, of the order of 10 us (PyTorch's overhead regime: H. He, "Making Deep Learning
#: Go Brrrr From First Principles", 2022, "Overhead"; the dev-discuss "Overhead in nn.Module" benchmark);
#: a compiled graph launches its kernels from generated wrapper code, a few us each (the CUDA launch itself,
#: NVIDIA's "CUDA C++ Best Practices Guide": launch overhead of a few microseconds). The launches run ahead
#: of the GPU asynchronously, so only a host time longer than the GPU's shows (small models). Seconds.
EAGER_OP_OVERHEAD = 10e-6
COMPILED_KERNEL_OVERHEAD = 4e-6

#: Kernels of a transformer block's forward besides its GEMMs, by op: eager PyTorch runs a composite
#: RMSNorm as 6 kernels (see :data:`EAGER_RMSNORM_TRAFFIC`; LayerNorm 1), rotary as 5 for q and 5 for k,
#: a gated activation as 2 (plain 1), a residual add each and the attention core as 1 fused kernel (eager /
#: math attention: 2 batched GEMMs, softmax and a scale: 4); compiled, each norm fuses with its residual
#: add, rotary and the activation are one kernel each. The backward launches about twice the forward's
#: kernels (the input and weight gradient of each GEMM, one or two kernels per element-wise op's
#: derivative, PyTorch ``derivatives.yaml``): :data:`BACKWARD_KERNELS`.
EAGER_RMSNORM_KERNELS = 6
EAGER_ROTARY_KERNELS = 10
EAGER_ATTENTION_KERNELS = 4
BACKWARD_KERNELS = 2.0

#: Elements an MoE layer's token permutation moves per routed copy of a hidden vector: gathered into
#: expert order (read + write) and scattered back for the weighted combine (read + write): Megatron-Core
#: ``moe_utils.permute``/``unpermute``. This model's count; multiplies ``compute_bytes``.
MOE_PERMUTE_TRAFFIC = 4.0

#: Bytes the router moves per (token, expert) logit: the fp32 logits written and read again by the
#: softmax / top-k (4 + 4; Megatron-Core and transformers' Mixtral compute router probabilities in fp32).
ROUTER_BYTES_PER_LOGIT = 8.0

#: The element width the per-element byte figures above are stated for (16-bit), so that
#: ``figure * compute_bytes / REFERENCE_ELEMENT_BYTES`` scales them to the recipe's width.
REFERENCE_ELEMENT_BYTES = 2.0

# --------------------------------------------------------------------------- FLOPs

#: FLOPs per multiply-accumulate of a matmul (one multiply, one add).
FLOPS_PER_MAC = 2.0

#: Attention FLOPs per (query, key, head dimension): two matmuls (``Q·Kᵀ`` and ``P·V``) of 2 FLOPs per
#: MAC each — the ``4·S·heads·head_dim`` per token and block Megatron-LM (Narayanan et al. 2021 §5.1)
#: and PaLM (Chowdhery et al. 2022, appendix B) count.
ATTENTION_FLOPS_PER_KEY = 4.0

#: Weight matrices of a gated MLP expert (gate, up, down) and projections fused in its first GEMM (gate
#: and up): Mixtral / Qwen-MoE experts, transformers' ``MixtralBlockSparseTop2MLP``.
GATED_MLP_MATRICES = 3.0
GATED_MLP_FUSED_INPUT = 2
#: Weight matrices of a plain (non-gated) MLP: fc1 and fc2 (GPT-2, BERT).
PLAIN_MLP_MATRICES = 2.0
#: Vocabulary-sized matrices of a model whose architecture is approximated from its parameter count:
#: the token embedding and an untied LM head.
EMBEDDING_MATRICES = 2.0

#: Model FLOPs of a training step per forward FLOP: the backward does twice the forward's matmul work
#: (input and weight gradients), so forward + backward = 3x (Kaplan et al. 2020 §2.1; Narayanan et al.
#: 2021 §5.1). Recomputation is not counted (model FLOPs, as MFU is defined: Chowdhery et al. 2022).
TRAINING_FLOPS_PER_FORWARD = 3.0

# --------------------------------------------------------------------------- parallel structure

#: Sublayers of a transformer block that end in a tensor-parallel collective (attention and the MLP):
#: Megatron-LM's ``f``/``g`` operators, one all-reduce each per direction (Shoeybi et al. 2019 §3,
#: Fig. 3); with sequence parallelism each becomes an all-gather in front and a reduce-scatter behind
#: (Korthikanti et al. 2022 §4.2.2).
TP_SUBLAYERS_PER_BLOCK = 2

#: All-to-alls of an expert-parallel MoE layer per direction: dispatch and combine (Megatron-Core
#: ``MoEAlltoAllTokenDispatcher``; the backward runs both in reverse).
EP_ALL_TO_ALLS = 2.0

#: Point-to-point transfers per micro-batch and virtual stage at a pipeline boundary: the activation
#: forward and its gradient back (Narayanan et al. 2021 §2.2).
PP_SENDS_PER_MICROBATCH = 2.0

#: Tensors ring attention passes between context-parallel ranks forward (K and V); the backward passes
#: them and their gradients, twice the forward's traffic (Liu et al. 2023, "Ring Attention";
#: TransformerEngine's ``AttnFuncWithCPAndKVP2P``).
CP_KV_TENSORS = 2.0
CP_BACKWARD_PASSES = 2

#: Parameter all-gathers per block and micro-batch under ZeRO-3/FSDP: one before the forward and one
#: again before the backward (Rajbhandari et al. 2020 §5.3; PyTorch FSDP ``reshard_after_forward``).
ZERO3_GATHERS_PER_MICROBATCH = 2

#: Share of an overlapped data-parallel collective's time that the computation beside it still loses: NCCL's
#: kernels run on the SMs (one thread block per channel, up to 32 channels on NVLink/IB systems: NCCL
#: ``NCCL_MAX_NCHANNELS``, ``src/include/device.h`` ``MAXCHANNELS 32``: up to 32 of an H100's 132 or an A100's
#: 108 SMs, 24-30 %) and move their buffers through HBM while the GEMMs run, so overlap hides a collective only in
#: part. 0.25, the SM share; not fitted. It is what makes FSDP slower per GPU on more GPUs (the rings' per-step
#: latencies grow with their length; torchtitan's 8B on 8 vs 128 H100s, llm-foundry's MPT on 128/256/512 H100s).
OVERLAPPED_COMM_SLOWDOWN = 0.25

#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``, ``torch/nn/parallel/distributed.py``),
#: bytes: the last bucket's reduction cannot hide behind the backward.
DDP_BUCKET_BYTES = 25 * 2**20

# --------------------------------------------------------------------------- communication

#: Fraction of the per-direction NVLink bandwidth NCCL ring collectives reach as bus bandwidth. NCCL's
#: own tuning model caps sm80 (A100) bus bandwidth at 235 GB/s of NVLink 3's 300 GB/s per direction
#: (``src/graph/tuning.cc``: ``if (compCap80) busBw = std::min(busBw, 235.0f)``) = 0.78, which is also
#: what ``nccl-tests`` all_reduce_perf reports on a DGX A100.
NVLINK_EFFICIENCY = 0.78

#: Fraction of a NIC's line rate NCCL reaches across nodes (InfiniBand/RoCE, GPUDirect RDMA): NCCL's
#: tuning model derates the LL128 protocol to 120/128 = 0.92 (``tuning.cc``), and ``nccl-tests`` on
#: multi-node DGX systems reports bus bandwidths of 90-95 % of the NICs' aggregate line rate.
NIC_EFFICIENCY = 0.92

#: Passes of a ring all-reduce over the buffer: a reduce-scatter then an all-gather, each moving
#: ``(n-1)/n`` of it in ``n-1`` steps (Patarasuk & Yuan 2009; NCCL's ``busBw`` factor ``2(n-1)/n`` in
#: nccl-tests ``doc/PERFORMANCE.md``); an all-gather or a reduce-scatter alone is one pass.
ALL_REDUCE_PASSES = 2.0

#: NCCL ring latency model (``src/graph/tuning.cc``): a base latency per collective and a latency per
#: ring step over NVLink or the network. The base is Ring/Simple's 8.4 us; the per-step figures are
#: Ring/LL128's hardware latencies (1.9 us NVLink, 4.0 us network) — the Simple figures include a
#: 256 kB chunk transfer, which the bandwidth term already counts. Seconds.
NCCL_BASE_LATENCY = 8.4e-6
NCCL_NVLINK_STEP_LATENCY = 1.9e-6
NCCL_NET_STEP_LATENCY = 4.0e-6

#: GPUs per node when nothing else is said: an 8-GPU NVLink server (DGX/HGX A100, H100, H200, B200; the
#: MI300X platform).
DEFAULT_NODE_SIZE = 8

#: Per-GPU network bandwidth per direction for accelerators whose catalog entry names no NIC: one
#: 400 Gb/s NDR InfiniBand / RoCE NIC per GPU (DGX H100: eight ConnectX-7 at 400 Gb/s) = 50 GB/s.
DEFAULT_NIC_BANDWIDTH = 400e9 / 8

#: SMs assumed for wave quantisation when the catalog entry gives none (the A100's 108).
DEFAULT_SM_COUNT = 108

# --------------------------------------------------------------------------- optimizer

#: Bytes of an fp32 element: gradients kept in fp32 (``fp32_grads``), master weights and optimizer
#: states under mixed precision.
FP32_BYTES = 4.0

#: Bytes an fp32 tensor element costs when read and written once (2 x 4).
READ_WRITE_FP32 = 2 * 4

#: Bytes per optimizer-state element of 8-bit Adam (bitsandbytes blockwise-quantised moments).
ADAM8BIT_STATE_BYTES = 1.0

#: Bytes the optimizer step reads and writes per trainable parameter, by optimizer, with ``p`` the
#: parameter bytes, ``g`` the gradient bytes and ``s`` the state element bytes (fp32 with master
#: weights or fp32 parameters): AdamW reads p, g, m, v (and the fp32 master) and writes p, m, v (and
#: the master) — ``torch.optim.adamw`` / apex ``FusedAdam``; Lion (lion-pytorch) reads p, g, m and writes p, m;
#: SGD with momentum reads p, g, buf and
#: writes p, buf; plain SGD reads p, g and writes p. Evaluated in :func:`optimizer_bytes_per_param`.
OPTIMIZER_STATE_TENSORS = {"adamw": 2, "adam": 2, "adam8bit": 2, "paged-adam8bit": 2, "adafactor": 0, "lion": 1,
                           "sgd-momentum": 1, "sgd": 0, "none": 0}


def optimizer_bytes_per_param(optimizer: str, param_bytes: float, grad_bytes: float, state_bytes: float,
                              master: bool) -> float:
    """HBM bytes the optimizer step moves per trainable parameter (see :data:`OPTIMIZER_STATE_TENSORS`)."""
    if optimizer == "none":
        return 0.0
    states = OPTIMIZER_STATE_TENSORS.get(optimizer, 2)
    sb = ADAM8BIT_STATE_BYTES if optimizer in ("adam8bit", "paged-adam8bit") else state_bytes
    moved = READ_WRITE * param_bytes + grad_bytes + READ_WRITE * states * sb
    if optimizer == "adafactor":
        moved += READ_WRITE_FP32  # the factored second moment is re-expanded element by element (fp32)
    if master:
        moved += READ_WRITE_FP32  # fp32 master weights read and written
    return moved


__all__ = [n for n in dir() if n.isupper()] + ["optimizer_bytes_per_param"]
