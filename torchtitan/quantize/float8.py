"""Float8 training of linear layers through torchao ([float8] config).

torchao's Float8Linear keeps the weight in high precision (it is the optimizer's master copy) and casts the
input, weight and output gradient to float8 on the fly for each of the three matmuls of a linear layer, with
dynamic scales (amax of the current tensor):
  tensorwise  one scale per tensor; supports float8 all-gather in FSDP2 (weights travel as float8: half the
              bytes of bf16) and precomputing all weight scales in one all-reduce after the optimizer step.
  rowwise     one scale per row (per column of the right-hand operand), power-of-2 scales; more accurate for
              tensors with outlier rows, slower kernel. torchao does not support float8 all-gather with it.

Which linears are converted (`module_filter`): the output head never (its logits feed a softmax over the whole
vocabulary and are the most quantization-sensitive matmul; published float8 recipes keep it in bf16), and not
layers with in or out features below `float8.min_dim` (the casts and scale reductions are a fixed cost that a
small matmul does not win back) or not divisible by 16 (a requirement of torch._scaled_mm).

A Float8Linear's parameters are ordinary high-precision tensors under the same names, so a checkpoint written
by a float8 run is a plain bf16/fp32 checkpoint and loads into a run without float8 (tests check it).
torchao is imported only when float8 is enabled: it is optional (the GPU machines may lack it).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from torch import nn

from torchtitan.errors import UserError
from torchtitan.log import logger
from torchtitan.models.llama3.model import normalize_fqn

_ALIGN = 16  # torch._scaled_mm needs both matrix dims of the weight to be multiples of 16


def _torchao_float8():
    try:
        import torchao.float8 as ao_float8
    except ImportError as e:
        raise UserError(
            f"float8.enable = true needs torchao, which cannot be imported here ({e}); "
            "install it (pip install torchao) or set float8.enable = false"
        ) from None
    return ao_float8


def filter_decision(fqn: str, in_features: int, out_features: int, min_dim: int) -> str | None:
    """None if the linear `fqn` should be converted to float8, else the reason it is skipped."""
    fqn = normalize_fqn(fqn)
    if fqn == "output" or fqn.endswith(".output"):
        return "output head (always high precision)"
    if min(in_features, out_features) < min_dim:
        return f"{in_features}x{out_features} has a dim below float8.min_dim={min_dim}"
    if in_features % _ALIGN or out_features % _ALIGN:
        return f"{in_features}x{out_features} not divisible by {_ALIGN}"
    return None


def _linears(model: nn.Module):
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]


def float8_flops_per_token(model: nn.Module, min_dim: int) -> int:
    """Training FLOPs per token of the linears the filter converts: 6 * sum(in * out) over them.

    Same 6*N convention as ModelArgs.flops_per_token (forward + two backward matmuls per weight), so
    float8_flops_per_token / flops_per_token is the share of the run's counted FLOPs done in float8.
    Call it on the whole model (e.g. on the meta device before pipeline splitting).
    """
    return sum(
        6 * m.in_features * m.out_features
        for fqn, m in _linears(model)
        if filter_decision(fqn, m.in_features, m.out_features, min_dim) is None
    )


def _group(fqns: list[str]) -> str:
    """'layers.0.attention.wq', 'layers.1.attention.wq' -> 'layers.*.attention.wq (x2)'."""
    counts: dict[str, int] = defaultdict(int)
    for fqn in fqns:
        counts[".".join("*" if p.isdigit() else p for p in fqn.split("."))] += 1
    return ", ".join(f"{k} (x{n})" if n > 1 else k for k, n in counts.items()) or "none"


def float8_config(cfg):
    """torchao Float8LinearConfig for the [float8] section."""
    ao = _torchao_float8()
    f8 = cfg.float8
    config = ao.Float8LinearConfig.from_recipe_name(f8.recipe)
    return dataclasses.replace(
        config, enable_fsdp_float8_all_gather=f8.enable_fsdp_float8_all_gather, emulate=f8.emulate
    )


def convert_to_float8(model: nn.Module, cfg) -> dict[str, list[str]]:
    """Swap the selected nn.Linear modules of `model` for torchao Float8Linear, in place, and log the decisions.

    Must run before tensor parallelism (torchao's Float8ColwiseParallel / Float8RowwiseParallel only accept
    Float8Linear modules, and the filter must see the global, unsharded shapes) and before AC, compile and
    FSDP (which wrap whatever modules exist). Returns {"converted": [...], "skipped": [...]} FQNs.
    """
    ao = _torchao_float8()
    config = float8_config(cfg)
    min_dim = cfg.float8.min_dim
    converted, skipped, reasons = [], [], {}

    def module_filter(mod: nn.Module, fqn: str) -> bool:
        reason = filter_decision(fqn, mod.in_features, mod.out_features, min_dim)
        (skipped if reason else converted).append(fqn)
        if reason:
            reasons[fqn] = reason
        return reason is None

    ao.convert_to_float8_training(model, module_filter_fn=module_filter, config=config)
    logger.info(
        "float8 (%s%s%s): converted %d linears: %s",
        cfg.float8.recipe,
        ", fsdp float8 all-gather" if cfg.float8.enable_fsdp_float8_all_gather else "",
        ", emulated" if cfg.float8.emulate else "",
        len(converted),
        _group(converted),
    )
    by_reason: dict[str, list[str]] = defaultdict(list)
    for fqn in skipped:
        by_reason[reasons[fqn]].append(fqn)
    for reason, fqns in by_reason.items():
        logger.info("float8: skipped %s: %s", _group(fqns), reason)
    return {"converted": converted, "skipped": skipped}


def build_scale_precompute(cfg):
    """A callable(model_parts) to run after each optimizer step, or None when not configured.

    With float8 all-gather, FSDP2 casts each weight to float8 before gathering it, which needs its scale
    (amax over the whole, sharded weight). torchao's precompute computes all of them in one all-reduce instead
    of one small all-reduce per layer.
    """
    f8 = cfg.float8
    if not (f8.enable and f8.precompute_float8_dynamic_scale_for_fsdp):
        return None
    precompute = _torchao_float8().precompute_float8_dynamic_scale_for_fsdp

    def run(model_parts: list[nn.Module]) -> None:
        for part in model_parts:
            precompute(part)

    return run


def is_tensorwise_float8(module: nn.Module) -> bool:
    """True for a torchao Float8Linear whose input is scaled tensorwise (the recipe torchao's float8 TP styles
    support); False for nn.Linear, other modules and the rowwise recipe. Imports torchao only for a module
    that can be a Float8Linear."""
    if type(module).__name__ != "Float8Linear":
        return False
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_linear import Float8Linear

    return (
        isinstance(module, Float8Linear)
        and module.config.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE
    )


def float8_tp_style(module: nn.Module, style: str, **kwargs):
    """The tensor-parallel style for `module` in a TP plan: style "colwise" or "rowwise", kwargs as for torch's
    ColwiseParallel / RowwiseParallel (input_layouts, output_layouts, use_local_output).

    For a Float8Linear with tensorwise scaling this is torchao's Float8ColwiseParallel / Float8RowwiseParallel,
    which cast the activation to float8 before the TP collective, so the all-gather moves float8 bytes. They only
    accept Float8Linear modules -- one reason float8 conversion runs before TP -- so every other module (skipped
    by the filter, or rowwise recipe, which torchao's float8 TP styles do not handle) gets torch's plain style;
    a Float8Linear under a plain style still computes in float8 after the collective.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if style not in ("colwise", "rowwise"):
        raise ValueError(f"style must be 'colwise' or 'rowwise', got {style!r}")
    if not is_tensorwise_float8(module):
        return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}[style](**kwargs)
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    return {"colwise": Float8ColwiseParallel, "rowwise": Float8RowwiseParallel}[style](**kwargs)
