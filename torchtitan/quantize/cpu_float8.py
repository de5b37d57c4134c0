"""Float8 matmuls on a CPU: torch._scaled_mm's CPU kernel as an fp32 matmul of the widened operands.

torch's CPU `_scaled_mm` goes to oneDNN, which on CPUs that report AVX512-FP16 and AMX (Intel Sapphire Rapids and
later) runs its reference kernel (`ref:any` under ONEDNN_VERBOSE=1): 1.8 s for one 256 x 256 x 256 product on a
2-core Xeon VM (2026-12-02), where an fp32 matmul of the same operands takes about 1 ms; a 5-step float8 run of the
test suite's tiny model then took 100 s a step and its tests timed out. The kernel's contract, with tensorwise or
row- / column-wise scales: products of the float8 operands summed in fp32, times scale_a x scale_b, plus the bias,
rounded to out_dtype. Widening float8 (e4m3 / e5m2) to fp32 is exact and so is a product of two widened values, so
an fp32 matmul of the widened operands keeps that contract; only the order of the sums differs, as it does between
any two kernels. torchao's float8 path (casts, scales, its tensor subclass, the float8 all-gather) runs unchanged
above it; CUDA keeps torch's kernel. `use_fp32_scaled_mm_on_cpu()` installs it once per process (the trainer does
when float8 trains on a CPU: torchtitan/parallel/__init__.py).
"""

from __future__ import annotations

import warnings

import torch

_LIB: torch.library.Library | None = None


def scaled_mm_fp32(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """torch._scaled_mm's result from an fp32 matmul of the widened float8 operands (see the module docstring).
    `use_fast_accum` changes nothing here (the sums are fp32 either way); a result scale (float8 output) is not
    supported."""
    if scale_result is not None:
        raise NotImplementedError(
            "torch._scaled_mm on a CPU (torchtitan/quantize/cpu_float8.py): scale_result (a float8 output) is not"
            " supported; float8 training never asks for it"
        )
    out = torch.mm(a.float(), b.float()) * scale_a.float() * scale_b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype or a.dtype)


def use_fp32_scaled_mm_on_cpu() -> None:
    """Make scaled_mm_fp32 the CPU kernel of aten::_scaled_mm in this process (once; later calls do nothing)."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns once that a registered kernel is being overridden: intended
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        lib.impl("_scaled_mm", scaled_mm_fp32, "CPU")
    _LIB = lib
