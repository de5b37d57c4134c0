"""The estimator's structural constants and bandwidth fractions, documented in docs/estimate.md ("Rates").

Compute rates (GEMMs by shape and dtype, flash attention by sequence length, power limits) are published
microbenchmarks in torchtitan/estimate/rates.py. What stays here are fractions of datasheet bandwidths and
structural constants, each with its basis; none is chosen by fitting the reference rows of
tests/estimate_reference.toml (validation.FITTED lists the constants that are, and it is empty).
`--estimate.calibrate` replaces the compute and bandwidth rates by measurements on the devices present
(torchtitan/estimate/calibrate.py); the structural constants (overlap, fragmentation) stay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Efficiency:
    # ---- memory-bound work (fractions of the HBM bandwidth) ----
    # elementwise kernels, casts, the loss, the optimizer: gpt-fast measures "about 1700 GB/s" of a 330 W A100's
    # 2039 (0.83) in its memory-bound decode; streaming kernels of several inputs sustain a little less
    hbm: float = 0.80
    # ---- communication (NCCL bus bandwidth as a fraction of the link's datasheet peak, one direction) ----
    # NVLink: nccl-tests' all-gather bus bandwidth on 8 H100 SXM is 360 of NVLink 4's 450 GB/s per direction
    # (NVIDIA/nccl-tests#212, #326); across nodes, one NIC's share of the ring: NVIDIA measures 192 GB/s of
    # DGX A100's 8 x 25 GB/s (NVIDIA/nccl#812) and 48-49 of a 50 GB/s ConnectX-7 (NVIDIA/nccl-tests#267): 0.96.
    # A ring across nodes is capped at the intra-node figure (collectives.busbw). MI300X (switchless mesh) takes its
    # measured RCCL figure instead (collectives.MESH_BUSBW_FRACTION). docs/estimate.md, "Rates".
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
    # graph's fused collectives (recompute, backward all-gathers) -0.077 / -0.055 / -0.084 under full AC and
    # -0.42 / -0.45 under op SAC: exposed 1.07 and 1.43, i.e. there the fused ops cost more than the plain
    # collectives plus the copies they replace (the post names the decomposed matmuls' wave quantization). Blocks
    # without recompute take the op-SAC figure (no measurement). docs/estimate.md, "Async TP, measured";
    # tests/test_estimate_validation.py re-derives all three.
    async_tp_exposed: float = 0.66
    async_tp_backward_exposed_full: float = 1.07
    async_tp_backward_exposed: float = 1.43
    # ---- memory ----
    fragmentation: float = 0.05  # caching-allocator reserved / allocated at the peak
    allocator_fixed_gib: float = 0.5  # cuBLAS/cuDNN workspaces and small pools held in the allocator
    # CPU (with a measured runtime): glibc's heap keeps part of the tensor memory a step frees. Its mmap threshold
    # rises to the largest block freed (mallopt(3), M_MMAP_THRESHOLD, dynamic up to 32 MiB), so from the first step
    # on the tensors of a small model live in the heap, whose freed holes stay resident. Measured as resident peak
    # with glibc's defaults minus with MALLOC_MMAP_THRESHOLD_=131072 (every tensor unmapped when freed), over the
    # estimated tensor peak: debug model at batch 4 0.036 / 0.174 GiB = 0.21, debugmodel_large at batch 2
    # 0.078 / 0.454 GiB = 0.17; the mean. docs/estimate.md, "CPU resident memory".
    cpu_heap_retention: float = 0.19
    # CUDA context + NCCL buffers: outside the allocator, counted only for `fits`
    cuda_context_gib: float = 1.0
    # ---- inference (decode reads every weight once per step: bandwidth-bound) ----
    decode_hbm_bf16: float = 0.83  # gpt-fast: "peak bandwidth is about 1700 GB/s" on its 330 W A100 (of 2039)
    # weight-only int8: dequantize fused into the GEMV, lower sustained bandwidth
    decode_hbm_int8: float = 0.65
    decode_hbm_int4: float = 0.55  # int4 group-32 (tinygemm): unpacking + per-group scales
    decode_layer_overhead_us: float = 55.0  # fixed per layer and decode step (kernel tails under CUDA graphs)


DEFAULT = Efficiency()
