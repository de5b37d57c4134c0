"""Generation estimate: prefill latency, per-token decode latency, tokens/s, weight and KV-cache memory.

Decode reads every weight of the rank once per step (plus the KV cache so far): at small batch it is bound by
memory bandwidth, at large batch by compute -- the roofline takes the slower. Each layer and step also pays a fixed
overhead (kernel tails, under CUDA graphs) and, with tensor parallelism, two all-reduces of a few KB whose cost is
latency, not bandwidth. Prefill is one forward over the prompt: compute-bound for prompts of more than a few
hundred tokens. Weight-only quantization (gpt-fast style): int8 with one bf16 scale per output channel, int4 in
groups of 32 with a bf16 scale and zero per group; embeddings stay bf16, the KV cache is bf16.

Usable from Python: estimate_inference(model_args, hardware, batch, prompt_len, gen_len, weight_dtype, tp) -> dict,
and for the generation benchmark's predicted column, generation_latency(model_args, gpu, batch, prompt_len,
gen_len, weight_dtype, tp) -> GenerationLatency (prefill_ms, decode_ms_per_token, tokens_per_sec).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from torchtitan.config.job_config import Estimate
from torchtitan.errors import UserError
from torchtitan.models.llama3 import ModelArgs

from . import rates
from .efficiency import DEFAULT, Efficiency
from .plan import GIB, Hardware, along_depths, model_linears, resolve_hardware

WEIGHT_BYTES = {"bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
INT4_GROUP = 32
TP_ALLREDUCE_LATENCY_US = 10.0  # one small all-reduce over NVLink (NCCL's latency-bound regime)
KV_BYTES = 2  # bf16 cache


def inference_hardware(est: Estimate, tp: int, calibration=None) -> Hardware:
    """The hardware of a generation plan: `tp` devices (its tensor-parallel degree), no collective bandwidth needed
    (its all-reduces are priced by latency: TP_ALLREDUCE_LATENCY_US)."""
    return resolve_hardware(dataclasses.replace(est, num_devices=tp), calibration, collectives=False)


def _linear_weight_bytes(in_f: int, out_f: int, dtype: str) -> float:
    w = in_f * out_f * WEIGHT_BYTES[dtype]
    if dtype == "int8":
        w += out_f * 2  # per-channel bf16 scale
    elif dtype == "int4":
        w += in_f * out_f / INT4_GROUP * 4  # bf16 scale + zero per group of 32
    return w


def estimate_inference(
    model_args: ModelArgs,
    hardware: Hardware,
    batch: int,
    prompt_len: int,
    gen_len: int,
    weight_dtype: str = "bfloat16",
    tp: int = 1,
    eff: Efficiency = DEFAULT,
    measured_decode_gbps: float | None = None,
    measured_decode_step: list | None = None,
    measured_prefill: list | None = None,
) -> dict:
    """Latency, throughput and memory of generating `gen_len` tokens after a `prompt_len` prompt, per sequence
    of a batch of `batch`, with weights in `weight_dtype` and `tp`-way tensor parallelism (times in ms).

    `measured_decode_gbps` (from --estimate.calibrate: the rate this device's decode matmuls read their bf16 weights
    at, calibrate.measure_decode_matmuls) replaces the datasheet bandwidth times decode_hbm_bf16; quantized weights
    are read at their default ratio to bf16. `measured_decode_step` and `measured_prefill` ([[n_layers, seconds],
    ...] from calibrate.measure_generation: this trainer's decode step at the mean context and its prefill over these
    prompts, timed on the device with these weights and batch at two depths) replace the model of each, carried to
    the model's depth."""
    for name, v in (("batch_size", batch), ("prompt_len", prompt_len), ("gen_len", gen_len), ("tp", tp)):
        if v < 1:
            raise UserError(f"estimate.{name} = {v} must be >= 1")
    if weight_dtype not in WEIGHT_BYTES:
        raise UserError(f"estimate.weight_dtype = {weight_dtype!r}; valid: {', '.join(WEIGHT_BYTES)}")
    a = model_args
    if a.n_heads % tp or a.n_kv_heads % tp:
        raise UserError(
            f"tensor_parallel_degree {tp} must divide n_heads={a.n_heads} and n_kv_heads={a.n_kv_heads}"
        )
    block, head = model_linears(a, 16)
    L = a.n_layers
    lin_bytes = L * sum(_linear_weight_bytes(x.in_features, x.out_features, weight_dtype) for x in block)
    lin_bytes += _linear_weight_bytes(head.in_features, head.out_features, weight_dtype)
    weights = lin_bytes / tp + a.vocab_size * a.dim * 2 / tp * (
        0 if a.tie_embeddings and weight_dtype == "bfloat16" else 1
    )
    weights += (2 * L + 1) * a.dim * 2  # norms
    kv_dim = a.n_kv_heads * a.head_dim
    ctx = prompt_len + gen_len
    kv_cache = batch * ctx * L * 2 * kv_dim * KV_BYTES / tp
    flop_params = a.num_flop_params()

    peak = hardware.bf16_tflops * 1e12 * rates.gemm_fraction(hardware.name, "bf16")
    peak *= rates.compute_factor(hardware.name, hardware.power_limit_w, hardware.sm_clock_mhz)
    bw_eff = {"bfloat16": eff.decode_hbm_bf16, "int8": eff.decode_hbm_int8, "int4": eff.decode_hbm_int4}[
        weight_dtype
    ]
    hbm = hardware.hbm_gbps * 1e9 * bw_eff
    if measured_decode_gbps:
        hbm = measured_decode_gbps * 1e9 * bw_eff / eff.decode_hbm_bf16
    overhead = L * (eff.decode_layer_overhead_us + (2 * TP_ALLREDUCE_LATENCY_US if tp > 1 else 0.0)) * 1e-6

    # decode: average context over the generated tokens
    avg_ctx = prompt_len + gen_len / 2
    kv_read = batch * avg_ctx * L * 2 * kv_dim * KV_BYTES / tp
    dec_bytes = lin_bytes / tp + kv_read + batch * a.dim * 2
    dec_flops = (2 * flop_params * batch + 4 * L * a.n_heads * a.head_dim * avg_ctx * batch) / tp
    decode_s = max(dec_bytes / hbm, dec_flops / peak) + overhead
    measured = along_depths(measured_decode_step or [], statistics.median, L) if tp == 1 else None
    if measured is not None:
        decode_s = measured

    # prefill: one forward over the prompt (causal attention: half the score matrix)
    pre_tokens = batch * prompt_len
    pre_flops = (2 * flop_params * pre_tokens + 2 * L * a.n_heads * a.head_dim * prompt_len * pre_tokens) / tp
    prefill_s = max(pre_flops / peak, (lin_bytes / tp) / hbm) + overhead
    measured_pre = along_depths(measured_prefill or [], statistics.median, L) if tp == 1 else None
    if measured_pre is not None:
        prefill_s = measured_pre

    total_s = prefill_s + gen_len * decode_s
    act = pre_tokens * (a.dim + a.ffn_hidden_dim / tp) * 2 * 4 + batch * prompt_len * a.vocab_size / tp * 4
    memory = weights + kv_cache + act + eff.allocator_fixed_gib * GIB
    return {
        "mode": "inference",
        "hardware": hardware.name,
        "weight_dtype": weight_dtype,
        "tp": tp,
        "batch_size": batch,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "prefill_ms": prefill_s * 1e3,
        "decode_ms_per_token": decode_s * 1e3,
        "tokens_per_sec": batch * gen_len / total_s,
        "decode_tokens_per_sec": batch / decode_s,
        "memory_gib": memory / GIB,
        "memory_breakdown_gib": {
            "weights": weights / GIB,
            "kv_cache": kv_cache / GIB,
            "activations": act / GIB,
            "allocator_overhead": eff.allocator_fixed_gib,
        },
        "fits": memory + eff.cuda_context_gib * GIB <= hardware.memory_gib * GIB,
        "bandwidth_bound": dec_bytes / hbm >= dec_flops / peak,
        "decode_measured": measured is not None,
        "prefill_measured": measured_pre is not None,
    }


@dataclass(frozen=True)
class GenerationLatency:
    prefill_ms: float  # one forward over the batch's prompts
    decode_ms_per_token: float  # one decode step (a token for every sequence of the batch), mean over gen_len
    tokens_per_sec: float  # generated tokens of the whole batch over prefill + decode
    hardware: str  # the hardware-table entry the figures are for


def generation_latency(
    model_args: ModelArgs,
    gpu: str | Hardware,
    batch: int = 1,
    prompt_len: int = 1,
    gen_len: int = 1,
    weight_dtype: str = "bfloat16",
    tp: int = 1,
) -> GenerationLatency:
    """The estimator's prediction for a generation run, for a benchmark to print next to what it measured.

    `gpu` is a hardware-table name ("h100-sxm", "a100"), what torch.cuda.get_device_name() returns ("NVIDIA H100
    80GB HBM3"), or a resolved Hardware. The decode step's cost grows with the KV cache, so decode_ms_per_token is
    the mean over the `gen_len` steps after a `prompt_len` prompt (the step at context prompt_len + gen_len/2).
    An unknown device or a CPU (whose rates only a calibration gives) raises UserError."""
    hw = gpu if isinstance(gpu, Hardware) else inference_hardware(Estimate(hardware=gpu), tp)
    r = estimate_inference(model_args, hw, batch, prompt_len, gen_len, weight_dtype, tp)
    return GenerationLatency(r["prefill_ms"], r["decode_ms_per_token"], r["tokens_per_sec"], hw.name)
