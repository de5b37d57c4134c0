"""bf16 compute on a CPU without bf16 instructions: fp32 kernels on operands rounded to bf16.

x86 CPUs without AVX512-BF16 or AMX (AMD before Zen 4, Intel before Cooper Lake) have no bf16 arithmetic, and
torch's bf16 matmul and flash-attention kernels for them convert inside and run 2-5x slower than its fp32
kernels on the same operands (docs/performance.md). A bf16 matmul's contract is: operands rounded to bf16,
products and sums in fp32, the result rounded to bf16. An fp32 kernel on the operands rounded to bf16 and widened
back keeps it: widening is exact, a product of two bf16 values is exact in fp32, the sums are fp32 and the
result is rounded to bf16 -- only the order of the sums differs, as it does between any two kernels.

`apply_cpu_bf16_kernels(model)` sends the model's bf16 matmuls and attention that way: every plain nn.Linear
becomes an `Fp32KernelLinear` (same parameters and state-dict keys), and every Attention block and a tied output
projection get drop-in kernels (`Attention.sdpa`, `Transformer.tied_linear`). They act where the operands are
bf16 (FSDP's bf16 parameters) or autocast would make them bf16 (one data-parallel rank), on plain CPU tensors or
DTensors of plain CPU tensors (tensor parallel: DTensor's sharding rules and collectives stay as they are, only
its local matmuls become fp32 ones); anything else (fp32 runs, other tensor subclasses such as quantized or
float8 weights, a bias) takes torch's own kernel.

- Linear: forward and backward in fp32 kernels, the incoming gradient and both outgoing gradients rounded to
  bf16 as in a bf16 backward; it keeps the bf16 operands for backward (the memory autocast's bf16 weight copies
  and activations take), and widens them again there.
- Linear without autograd and with fewer than 64 rows (generation's decode steps, which
  torchtitan/generate/loader.py sends here too): one pass over the weight decides the speed, and widening a
  whole weight to fp32 for a few rows would cost more than the product. Weights of 2M elements or more go to
  oneDNN's bf16 matmul (fp32 sums, bf16 result: the same contract), which streams them 1.2-2x faster than torch's
  bf16 kernel here; smaller ones to torch's own bf16 kernel, faster than oneDNN's call overhead.
- Attention: SDPA in fp32 on the bf16-rounded q/k/v, output rounded to bf16. Unlike torch's bf16 CPU kernel it
  keeps the softmax probabilities in fp32 before the product with V (at least as accurate), and autograd keeps
  its inputs in fp32 for backward (twice the bf16 kernel's saved q/k/v/output).

On by default where it applies (`training.cpu_bf16_fp32_kernels`); MFU is then measured against this CPU's fp32
matmul rate, the kernels the run uses (docs/metrics.md). CUDA and CPUs with bf16 instructions never use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan.log import logger
from torchtitan.metrics.hardware import cpu_lacks_bf16_instructions

BF16 = torch.bfloat16


def fp32_kernels_apply(device_type: str, dtype: torch.dtype, enabled: bool = True) -> bool:
    """Whether a run on `device_type` computing in `dtype` uses this module's kernels (the one rule: the trainer,
    its MFU peak and the estimator's calibration all ask here)."""
    return enabled and device_type == "cpu" and dtype == BF16 and cpu_lacks_bf16_instructions()


def matmul_dtype(device_type: str, dtype: torch.dtype, enabled: bool = True) -> torch.dtype:
    """The dtype the run's matmul and attention kernels compute in: float32 where this module's kernels apply,
    else the compute dtype itself (what MFU calibrates and the SDPA backend probe ask about)."""
    return torch.float32 if fp32_kernels_apply(device_type, dtype, enabled) else dtype


_PLAIN = (torch.Tensor, nn.Parameter)


def _applies(*tensors: torch.Tensor) -> bool:
    """Plain CPU tensors, or DTensors of them (tensor parallel), whose computation is bf16: bf16 operands, or
    autocast to bf16 active. Other tensor subclasses (torchao's quantized or float8 weights) keep their own
    kernels. (Plain loops: this runs for every linear of every decode step, where microseconds show.)"""
    bf16 = False
    for t in tensors:
        # the shard itself: to_local() would record an autograd op per call (19 us on a 2-core VM, per operand)
        local = t._local_tensor if type(t) is DTensor else t
        if type(local) not in _PLAIN or not local.is_cpu:
            return False
        bf16 = bf16 or t.dtype == BF16
    return bf16 or (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == BF16)


class _LinearInFp32(torch.autograd.Function):
    """y = round_bf16(x) @ round_bf16(w).T in an fp32 kernel, rounded to bf16; see the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xb, wb = x.to(BF16), w.to(BF16)
        ctx.save_for_backward(xb, wb)
        ctx.dtypes = (x.dtype, w.dtype)
        return F.linear(xb.float(), wb.float()).to(BF16)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xb, wb = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        g = grad.to(BF16).float()
        grad_x = grad_w = None
        with torch.autocast("cpu", enabled=False):
            if ctx.needs_input_grad[0]:
                grad_x = (g @ wb.float()).to(BF16).to(x_dtype)
            if ctx.needs_input_grad[1]:
                grad_w = (g.flatten(0, -2).t() @ xb.flatten(0, -2).float()).to(BF16).to(w_dtype)
        return grad_x, grad_w


# Without autograd (generation), fewer rows than ONEDNN_MAX_ROWS: a linear is one pass over its weight, and
# oneDNN's bf16 matmul streams bf16 weights near memory speed, 1.2-2x torch's bf16 kernel on this kind of CPU,
# but only for weights of ONEDNN_MIN_WEIGHT elements or more: its ~50 us call overhead loses on small ones,
# where torch's bf16 kernel is the fastest. From ~64 rows the fp32 kernel's widening of the weight pays for
# itself (docs/performance.md). Autograd has no formula for oneDNN's op: training never uses it.
ONEDNN_MAX_ROWS = 64
ONEDNN_MIN_WEIGHT = 2**21
# where torch reports oneDNN bf16 support for this CPU (on x86: AVX512); elsewhere torch's kernel
_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
    and torch.ops.mkldnn._is_mkldnn_bf16_supported()
)


@torch.library.custom_op("torchtitan::onednn_bf16_linear", mutates_args=())
def _onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for bf16 x and weight in oneDNN's matmul (fp32 sums, result rounded to bf16). An opaque op
    under torch.compile: Inductor's own lowering of oneDNN's linear wants weights frozen into the graph."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


@_onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def few_rows_kernel(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """The kernel for a bf16 linear without autograd: "onednn" or "torch" (its own bf16 kernel) for fewer than
    ONEDNN_MAX_ROWS rows, by the weight's size; None (the fp32 kernel) for more rows."""
    if x.numel() >= ONEDNN_MAX_ROWS * x.shape[-1]:
        return None
    return "onednn" if _ONEDNN and weight.numel() >= ONEDNN_MIN_WEIGHT else "torch"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, with bf16 computation through fp32 kernels where it applies (for a few rows without autograd,
    oneDNN's or torch's bf16 kernel: few_rows_kernel)."""
    if bias is not None or not _applies(x, weight):
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    kernel = None if needs_grad else few_rows_kernel(x, weight)
    if kernel is None:
        with torch.autocast("cpu", enabled=False):
            return _LinearInFp32.apply(x, weight)
    if x.dtype != BF16 or weight.dtype != BF16:  # under autocast (skipped when bf16 already: per-call cost)
        x, weight = x.to(BF16), weight.to(BF16)
    if kernel == "torch":
        return F.linear(x, weight)
    if torch.compiler.is_compiling():
        return _onednn_linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention, with bf16 computation through the fp32 kernel where it applies."""
    if not _applies(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(
            q.to(BF16).float(), k.to(BF16).float(), v.to(BF16).float(), **kwargs
        )
    return out.to(BF16)


class Fp32KernelLinear(nn.Linear):
    """nn.Linear whose bf16 computation runs in fp32 kernels (module docstring); same parameters and keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def apply_cpu_bf16_kernels(model: nn.Module) -> int:
    """Route `model`'s linear layers, attention and tied output projection through this module's kernels.
    Returns the number of linear layers swapped."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear:  # exact type: float8 or other converted linears keep their own forward
            module.__class__ = Fp32KernelLinear
            swapped += 1
        if hasattr(module, "sdpa"):
            module.sdpa = scaled_dot_product_attention
        if hasattr(module, "tied_linear"):
            module.tied_linear = linear
    logger.info(
        "bf16 on a CPU without bf16 instructions: matmuls and attention run in fp32 kernels on operands rounded"
        " to bf16 (oneDNN's bf16 matmul for a few rows without autograd), results rounded to bf16"
        " (training.cpu_bf16_fp32_kernels; docs/parallelism.md)"
    )
    return swapped


def use_cpu_bf16_kernels(model: nn.Module, device_type: str, dtype: torch.dtype, enabled: bool) -> bool:
    """apply_cpu_bf16_kernels where they apply (fp32_kernels_apply); whether they did. For code that builds a
    model outside `parallelize` (generation, the benchmarks' bare loops)."""
    if not fp32_kernels_apply(device_type, dtype, enabled):
        return False
    apply_cpu_bf16_kernels(model)
    return True
