"""The estimator's structural constants and bandwidth fractions, documented in docs/estimate.md ("Rates").

Compute rates (GEMMs by shape and dtype, flash attention by sequence length, power limits) are published
microbenchmarks in torchtitan/estimate/rates.py. What stays here are fractions of datasheet bandwidths and
structural constants, each with its basis. One has no source and is chosen on the reference rows of
tests/estimate_reference.toml: decode_layer_overhead_us, fitted on the decode rows (validation.FITTED; its value
here is the fit on every source, and the cross-validated table estimates each decode source with the value fitted
without it). None of the training rates or fractions is fitted.
`--estimate.calibrate` replaces the compute and bandwidth rates by measurements on the devices present
(torchtitan/estimate/calibrate.py); the structural constants (overlap, fragmentation) stay.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- decode kernels' bandwidth (docs/estimate_log.md, "Decode kernels' bandwidth, second search") ----
# bf16 decode: gpt-fast's "peak bandwidth is about 1700 GB/s" on its 330 W A100 (of 2,039).
DECODE_HBM_BF16 = 0.83
# int8 weight-only (Inductor's fused dequantize + GEMV, what gpt-fast's and torchao's int8 linears compile to at
# batch 1): PyTorch's own microbenchmark of that kernel, benchmarks/gpt_fast/benchmark.py `run_gemv` (`W.to(x.dtype)
# @ x` compiled with coordinate_descent_tuning, square D x D weights, D = 1024, 4096, 8192, 16384, bytes of W over
# the kernel time, averaged over D), measured on the CI's A100 in pytorch/pytorch#128002 (2024-06-05): int8
# 984.06 GB/s, bfloat16 1137.92 GB/s. The int8 kernel sustains 0.865 of the bf16 GEMV's bandwidth.
GEMV_INT8_GBPS, GEMV_BF16_GBPS = 984.06, 1137.92
DECODE_HBM_INT8 = round(DECODE_HBM_BF16 * GEMV_INT8_GBPS / GEMV_BF16_GBPS, 2)
# int4 weight-only (torch's _weight_int4pack_mm, tinygemm: gpt-fast's and torchao's int4 kernel). Marlin's README
# (IST-DASLab/marlin ac6988b, 2024-01-17, assets/peak.png and assets/sustained.png: "16bit x 4bit (group=128) mul
# with 72k x 18k matrix on NVIDIA A10", speedup over fp16 PyTorch calling CUTLASS) plots "torch-nightly" -- torch's
# one 4-bit kernel then, tinygemm -- at batch 1 at 3.59x with the GPU at its boost clock and 3.02x with the clocks
# locked at base (read off the plots by pixel against the grid; Marlin itself at 3.88x and 3.86x, about the ideal).
# tinygemm reads 4.25 bits per weight at group 128 (a bf16 scale and zero per group) where fp16 reads 16, so it
# sustains speedup / (16 / 4.25) of the fp16 kernel's bandwidth: 0.95 at boost, 0.80 at base clock. What limits it
# is dequantization work per byte (the README: lower clocks "significantly harm the relative speedups of prior
# kernels"), and an A100 asks more of each SM than either A10 point: 2,039 GB/s over 108 SMs at (at most) 1.41 GHz
# is 13.4 bytes per SM-cycle, the A10's 600 GB/s over 72 SMs 4.9 at 1.695 GHz (boost) and 9.4 at 0.885 GHz (base).
# The nearer point, base clock, is taken (an upper bound by that trend); the group-32 layout's extra scales are
# counted as bytes (inference.py), their per-group work is not.
TINYGEMM_SPEEDUP_A10_BASE_CLOCK = 3.02
TINYGEMM_G128_BITS_PER_WEIGHT = 4.0 + 2 * 16 / 128
DECODE_HBM_INT4 = round(
    DECODE_HBM_BF16 * TINYGEMM_SPEEDUP_A10_BASE_CLOCK * TINYGEMM_G128_BITS_PER_WEIGHT / 16, 2
)


@dataclass(frozen=True)
class Efficiency:
    # ---- memory-bound work (fractions of the HBM bandwidth) ----
    # elementwise kernels, casts, the loss, the optimizer: gpt-fast measures "about 1700 GB/s" of a 330 W A100's
    # 2039 (0.83) in its memory-bound decode; streaming kernels of several inputs sustain a little less. Checked on
    # torch's eager kernels on an H100 SXM (Liger-Kernel's benchmark data, `relu_squared` by torch: two contiguous
    # bf16 kernels at 4096 x 4096..16384): 0.75 / 0.82 / 0.86 of 3,352 GB/s (docs/estimate.md, "Rates")
    hbm: float = 0.80
    # ---- communication (NCCL bus bandwidth as a fraction of the link's datasheet peak, one direction) ----
    # NVLink: nccl-tests' all-gather bus bandwidth on 8 H100 SXM is 360 of NVLink 4's 450 GB/s per direction
    # (NVIDIA/nccl-tests#212, #326); across nodes, one NIC's share of the ring: NVIDIA measures 192 GB/s of
    # DGX A100's 8 x 25 GB/s (NVIDIA/nccl#812) and 48-49 of a 50 GB/s ConnectX-7 (NVIDIA/nccl-tests#267): 0.96.
    # A ring across nodes is capped at the intra-node figure (collectives.busbw). Where a whole node's ring was
    # measured (MI300X's RCCL mesh, NVLink 5's NCCL on 8 B200) that figure stands instead
    # (collectives.RING_BUSBW_FRACTION). docs/estimate.md, "Rates".
    intra_node: float = 0.80
    inter_node: float = 0.96
    # TP collectives sit on the critical path (the next matmul needs the gathered input): exposed fraction
    tp_exposed: float = 1.0
    # torch's async TP (steptime.async_tp_exposed_time), measured: the dev-discuss post "[Distributed w/ TorchTitan]
    # Introducing Async Tensor Parallelism in PyTorch" (Wang et al., 2024-09), Figure 9 (its image:
    # pytorch-labs/applied-ai, assets/images/dev-discuss-asynctp/Figure_9.png): forward duration and tokens/s
    # without / with async TP on 64 H100 (FSDP 8 x TP 8, seq 8192, compiled, bf16): 70B full AC at local batch
    # 12 / 8 / 4, 8B per-op SAC at 12 / 8. What async TP saved (forward: the forward duration; the rest of the
    # step: the step time from tokens/s less that) minus the layout copies it removes
    # (steptime.sp_layout_copy_bytes), over the collectives it fuses there (this estimator's ring times), is the
    # hidden fraction: forward 0.29 / 0.33 / 0.34 / 0.37 / 0.35, so 0.66 stays exposed (the mean); the backward
    # graph's fused collectives (recompute, backward all-gathers) 0.011 / 0.078 / -0.017 under full AC and
    # -0.40 / -0.41 under op SAC: exposed 0.98 and 1.40; above 1, the fused ops cost more than the plain
    # collectives plus the copies they replace (the post names the decomposed matmuls' wave quantization). The
    # backward's saving is net of the change async TP's shorter compute makes to FSDP's exposure
    # (collectives.overlap_extension: fewer GEMMs beside the rings); before that rule (session 19) it read
    # -0.077 / -0.055 / -0.084 and -0.42 / -0.45 (1.07, 1.43); until session 44 the full-AC recompute counted w2's
    # reduce-scatter, which the recompute does not rerun (activations.tp_collectives_recomputed): -0.062 / -0.006 /
    # -0.084 (1.05). Blocks without recompute take the op-SAC figure (no measurement). docs/estimate_log.md, "Async
    # TP, measured"; tests/test_estimate_validation.py re-derives all three.
    async_tp_exposed: float = 0.66
    async_tp_backward_exposed_full: float = 0.98
    async_tp_backward_exposed: float = 1.40
    # ---- memory ----
    # caching-allocator reserved / allocated at the peak, less 1. Measured: this project's seven one-H200 runs
    # (docs/performance.md, 2026-11-23; the offload run aside), max reserved over max active: 1.003-1.134, median
    # 1.050 (active >= allocated, so a lower bound on reserved / allocated). Published FSDP runs without expandable
    # segments hold 1.20-1.36 (torchtitan#135's 8 x H100 FSDP1 / FSDP2 logs, reserved over active); with them
    # Megatron-LM#6885's M-FSDP run holds 1.089 (203,504 MiB allocated, 221,706 reserved). docs/estimate.md, "Rates".
    fragmentation: float = 0.05
    # what torch's allocator holds for the libraries at any peak, GiB: one cuBLAS workspace per (handle, stream)
    # that runs a GEMM, 32 MiB on sm90 (aten/src/ATen/cuda/CublasHandlePool.cpp, "32MiB for Hopper", since
    # pytorch/pytorch#91564, torch 2.0; 8.125 MiB elsewhere until #175344, 2026-02), kept until cleared and
    # allocated through the caching allocator; a step's forward (the main thread) and backward (autograd's device
    # thread) hold one each, 64 MiB; cuBLASLt's 1 MiB each; the small pool's 2 MiB segments, ~17 MiB in a
    # torchtitan memory summary (torchtitan#735, "from small pool | 16 MiB | 17 MiB", as a search helper quoted it;
    # the thread was not re-read): 83 MiB, the Hopper sum taken
    # for every part (the 8.125 MiB parts hold 0.045 GiB less). Attention's backward scratch (FlashAttention-2's and
    # cuDNN's fp32 dQ accumulator, 4 bytes x tokens x heads x head dim) lives inside one block's backward, below the
    # FFN's working set at the block's peak: not added. 0.5 (no source) until 2026-12-03.
    allocator_fixed_gib: float = 0.083
    # CPU (with a measured runtime): glibc's heap keeps part of the tensor memory a step frees. Its mmap threshold
    # rises to the largest block freed (mallopt(3), M_MMAP_THRESHOLD, dynamic up to 32 MiB), so from the first step
    # on the tensors of a small model live in the heap, whose freed holes stay resident. Measured as resident peak
    # with glibc's defaults minus with MALLOC_MMAP_THRESHOLD_=131072 (every tensor unmapped when freed), over the
    # estimated tensor peak: debug model at batch 4 0.036 / 0.174 GiB = 0.21, debugmodel_large at batch 2
    # 0.078 / 0.454 GiB = 0.17; the mean. docs/estimate_log.md, "CPU resident memory".
    cpu_heap_retention: float = 0.19
    # CUDA context + NCCL buffers: outside the allocator, counted only for `fits`. The context with lazy module
    # loading (CUDA >= 12.2's default; torch sets it since 1.13): 287,047,680 B after one .cuda() (pytorch/pytorch
    # #86509), "around 400MB" (#109888), 0.48 GiB at an OOM on one GPU (torchchat#1341); NCCL (>= 2.22 connects only
    # the algorithms a job uses): ~10 MiB per channel and peer (src/init.cc DEFAULT_BUFFSIZE and the LL / LL128
    # buffers), NVLS 16 x 2 x 1 MiB x 8 = 256 MiB per communicator on 8 Hopper GPUs (src/transport/nvls.cc, 2.21's
    # 128 KiB step). Together 0.8-1.3 GiB for one FSDP communicator on one 8-GPU node; NVIDIA/nccl#1685 measured
    # "NV 1.06 GB" per GPU on 8 x H100 with PyTorch's memory excluded, before an all-to-all. Each further
    # communicator (TP, CP, PP, HSDP) adds more: nccl_communicator_gib.
    cuda_context_gib: float = 1.0
    # NCCL's device buffers of each communicator beyond the first (TP, CP, PP, HSDP's replicas, FSDP over dp_shard x
    # cp beside CP's own), outside torch's allocator, for `fits` only: the ring's and the tree's receive buffers over
    # 16 channels (the Hopper node's, NVIDIA/nccl#1453), ~10 MiB a channel and peer (src/init.cc: SIMPLE 4 MiB
    # DEFAULT_BUFFSIZE, LL128 4.69 MiB, LL 0.5 MiB, on cuMem's 2 MiB granularity: "one type of size 10485760" in
    # NVIDIA/nccl#1685): 2 x 16 x 10 MiB = 0.31 GiB, the low end of what such a communicator holds (NVLink SHARP's
    # 256 MiB on an 8-GPU NVSwitch node, P2P channels and network buffers come on top where they are used).
    nccl_communicator_gib: float = 2 * 16 * 10 / 1024
    # ---- inference (decode reads every weight once per step: bandwidth-bound) ----
    decode_hbm_bf16: float = DECODE_HBM_BF16
    decode_hbm_int8: float = DECODE_HBM_INT8  # 0.72: Inductor's int8 GEMV at 0.865 of the bf16 GEMV's (above)
    decode_hbm_int4: float = DECODE_HBM_INT4  # 0.67: tinygemm at 0.80 of the fp16 GEMV's bandwidth (above)
    # fixed per layer and decode step (kernel tails and gaps under CUDA graphs): FITTED in validation.py (chosen on
    # the decode rows, 20..90 us in 5 us steps; this is the fit on every source). A measured kernel startup under a
    # CUDA graph (gpu-benches' gpu-small-kernels on an A100 80GB: 3.3 us a DRAM-streaming kernel, 1.3 us an
    # L2-resident one) x the 11-13 kernels a compiled decode layer launches is 26-33 us of it: the rest has no
    # source (docs/estimate_log.md, "The decode step's per-layer overhead against a measured kernel startup")
    decode_layer_overhead_us: float = 55.0


DEFAULT = Efficiency()
