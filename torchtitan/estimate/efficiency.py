"""The estimator's default efficiencies: one set for every configuration, documented in docs/estimate.md.

Each number is the fraction of a datasheet peak (torchtitan/metrics/hardware.py) that a kind of work sustains.
They were set once, from the published runs in tests/estimate_reference.toml taken together, and are never
changed per configuration. `--estimate.calibrate` replaces the compute and bandwidth ones by measurements on the
devices present (torchtitan/estimate/calibrate.py); the structural constants (overlap, fragmentation) stay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Efficiency:
    # ---- compute (fractions of the dense peak of the matmul's dtype) ----
    matmul_bf16: float = 0.55  # a large bf16 GEMM (all dims >= a few thousand): cuBLAS on Hopper, in training
    # a large float8 GEMM, of the FP8 peak (torchao tensorwise/rowwise via _scaled_mm)
    matmul_fp8: float = 0.50
    # flash attention forward, of the BF16 peak, on the FLOPs it really does (causal)
    attention_fwd: float = 0.33
    attention_bwd: float = 0.25  # flash attention backward (5 matmuls, recomputes the scores), same basis
    # ---- memory-bound work (fractions of the HBM bandwidth) ----
    hbm: float = 0.80  # elementwise kernels, casts, the loss, the optimizer
    # ---- communication (NCCL bus bandwidth as a fraction of the link's datasheet peak, one direction) ----
    intra_node: float = 0.80
    inter_node: float = 0.80
    # TP collectives sit on the critical path (the next matmul needs the gathered input): exposed fraction
    tp_exposed: float = 1.0
    async_tp_exposed: float = 0.5  # torch's async TP micro-pipelines them with the matmuls; about half stays
    # ---- memory ----
    fragmentation: float = 0.05  # caching-allocator reserved / allocated at the peak
    allocator_fixed_gib: float = 0.5  # cuBLAS/cuDNN workspaces and small pools held in the allocator
    # CUDA context + NCCL buffers: outside the allocator, counted only for `fits`
    cuda_context_gib: float = 1.0
    # ---- inference (decode reads every weight once per step: bandwidth-bound) ----
    decode_hbm_bf16: float = 0.83  # gpt-fast: "peak bandwidth is about 1700 GB/s" on its 330 W A100 (of 2039)
    # weight-only int8: dequantize fused into the GEMV, lower sustained bandwidth
    decode_hbm_int8: float = 0.65
    decode_hbm_int4: float = 0.55  # int4 group-32 (tinygemm): unpacking + per-group scales
    decode_layer_overhead_us: float = 55.0  # fixed per layer and decode step (kernel tails under CUDA graphs)


DEFAULT = Efficiency()
