"""Inference benchmark over a prompt file: latency, throughput, memory, the batch size that fit, ROUGE-1.

Input: a jsonl file, one object per line, {"prompt": str, "reference": str (optional)}. Every field of the
result is defined in docs/generate.md ("Benchmark fields"); the summary is a table and a JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from torchtitan.config.job_config import Estimate
from torchtitan.data import Tokenizer
from torchtitan.errors import UserError
from torchtitan.generate.complete import complete
from torchtitan.generate.loader import LoadedModel
from torchtitan.generate.rouge import rouge1_f1
from torchtitan.generate.sampling import Sampling
from torchtitan.metrics import MemoryMonitor


@dataclass
class Prompt:
    prompt: str
    reference: str | None = None


def read_prompts(path: str) -> list[Prompt]:
    """The prompts of a jsonl file; a bad line is a one-line error naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--prompts {path} does not exist")
    prompts = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise UserError(
                    f'{path}:{n}: expected an object with a string "prompt" (and optional "reference")'
                )
            ref = obj.get("reference")
            if ref is not None and not isinstance(ref, str):
                raise UserError(f'{path}:{n}: "reference" must be a string')
            prompts.append(Prompt(obj["prompt"], ref))
    if not prompts:
        raise UserError(f"--prompts {path} holds no prompts")
    return prompts


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _median_p90(values: list[float]) -> dict:
    return {"median": percentile(values, 50), "p90": percentile(values, 90)}


def run_benchmark(
    loaded: LoadedModel,
    tokenizer: Tokenizer,
    prompts: list[Prompt],
    max_new_tokens: int,
    sampling: Sampling,
    batch_size: int,
    seed: int = 0,
    compile: bool = False,
    settings: dict | None = None,
    estimate: Estimate | None = None,
    weight_dtype: str = "bfloat16",
) -> dict:
    """Generate for every prompt and measure; returns the JSON-ready result (fields: docs/generate.md), with the
    estimator's prediction for the same run next to it (`estimate`: the [estimate] config section)."""
    memory = MemoryMonitor(loaded.device)  # peak from here: loading the weights is not counted
    t0 = time.perf_counter()
    out = complete(
        loaded, tokenizer, [p.prompt for p in prompts], max_new_tokens, sampling, batch_size, seed, compile
    )
    total_s = time.perf_counter() - t0
    scores = [rouge1_f1(text, p.reference) for text, p in zip(out.texts, prompts) if p.reference is not None]
    generation_s = sum(g.first_token_s + sum(g.decode_s) for g in out.batches)
    new_tokens = sum(out.new_tokens)
    mem = memory.snapshot()
    return {
        "settings": settings or {},
        "documents": len(prompts),
        "prompt_tokens": {"total": sum(out.prompt_tokens), "mean": statistics.mean(out.prompt_tokens)},
        "generated_tokens": new_tokens,
        "batch_size_requested": batch_size,
        "batch_size_reached": out.batch_size,
        "oom_batch_sizes": out.oom_batch_sizes,
        "batches": len(out.batches),
        "ttft_s": _median_p90([g.first_token_s for g in out.batches]),
        "prefill_s": _median_p90([g.prefill_s for g in out.batches]),
        "decode_token_s": _median_p90([s for g in out.batches for s in g.decode_s]),
        "generated_tokens_per_s": new_tokens / generation_s if generation_s > 0 else None,
        "documents_per_s": len(prompts) / total_s,
        "total_s": total_s,
        "tokenize_s": out.tokenize_s,
        "detokenize_s": out.detokenize_s,
        "peak_memory_gib": {
            k.removeprefix("memory/"): v for k, v in mem.items() if k.endswith("_gib") and "max_" in k
        },
        "estimator": predicted_latency(
            estimate or Estimate(),
            loaded.args,
            loaded.device,
            loaded.world_size,
            out.batch_size,
            round(statistics.mean(out.prompt_tokens)),
            max_new_tokens,
            weight_dtype,
        ),
        "rouge1_f1": statistics.mean(scores) if scores else None,
        "rouge1_documents": len(scores),
        "completions": [
            {"prompt_tokens": pt, "new_tokens": nt, "text": text}
            for pt, nt, text in zip(out.prompt_tokens, out.new_tokens, out.texts)
        ],
    }


def predicted_latency(
    estimate: Estimate,
    model_args,
    device: torch.device,
    tp: int,
    batch: int,
    prompt_len: int,
    gen_len: int,
    weight_dtype: str,
) -> dict:
    """The estimator's prefill and per-step decode latency (ms) for this model, batch, prompt length, new tokens,
    weight dtype and tensor-parallel degree (torchtitan/estimate, docs/estimate.md), or {"unavailable": why}.

    On CUDA the hardware is the GPU found, from the hardware table; a CPU has no datasheet, so its rates come from
    --estimate.peak_tflops and --estimate.hbm_bandwidth_gbps (measured by `python -m torchtitan.estimate
    --estimate.hardware=cpu --estimate.calibrate=true`). Other [estimate] overrides apply as in the estimator."""
    from torchtitan.estimate import generation_latency
    from torchtitan.estimate.inference import inference_hardware

    if weight_dtype not in ("bfloat16", "int8", "int4"):
        return {"unavailable": f"the estimator models bfloat16, int8 and int4 weights, not {weight_dtype}"}
    if device.type == "cpu" and (estimate.peak_tflops is None or estimate.hbm_bandwidth_gbps is None):
        return {
            "unavailable": "no datasheet for a CPU: pass --estimate.peak_tflops and --estimate.hbm_bandwidth_gbps"
            " (python -m torchtitan.estimate --estimate.hardware=cpu --estimate.calibrate=true measures them)"
        }
    try:
        hw = inference_hardware(dataclasses.replace(estimate, hardware=device_name(device)), tp)
        lat = generation_latency(model_args, hw, batch, prompt_len, gen_len, weight_dtype, tp)
    except UserError as e:
        return {"unavailable": str(e)}
    return {
        "hardware": lat.hardware,
        "prefill_ms": lat.prefill_ms,
        "decode_ms_per_token": lat.decode_ms_per_token,
        "at": {"batch": batch, "prompt_len": prompt_len, "gen_len": gen_len, "weight_dtype": weight_dtype},
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.2f} ms"


def _predicted(e: dict) -> str:
    if "unavailable" in e:
        return f"n/a: {e['unavailable']}"
    at = e["at"]
    return (
        f"{e['prefill_ms']:.2f} ms / {e['decode_ms_per_token']:.2f} ms ({e['hardware']}, batch {at['batch']},"
        f" prompt {at['prompt_len']}, {at['gen_len']} new, {at['weight_dtype']})"
    )


def format_table(r: dict) -> str:
    """The benchmark result as an aligned two-column text table."""
    rows = [
        ("documents", f"{r['documents']} ({r['prompt_tokens']['mean']:.0f} prompt tokens on average)"),
        ("generated tokens", f"{r['generated_tokens']}"),
        ("batch size (asked -> reached)", f"{r['batch_size_requested']} -> {r['batch_size_reached']}"),
        ("batch sizes out of memory", ", ".join(map(str, r["oom_batch_sizes"])) or "none"),
        ("time to first token (median / p90)", f"{_ms(r['ttft_s']['median'])} / {_ms(r['ttft_s']['p90'])}"),
        ("prefill (median / p90)", f"{_ms(r['prefill_s']['median'])} / {_ms(r['prefill_s']['p90'])}"),
        (
            "decode per token (median / p90)",
            f"{_ms(r['decode_token_s']['median'])} / {_ms(r['decode_token_s']['p90'])}",
        ),
        ("estimator: prefill / decode per token", _predicted(r["estimator"])),
        ("generated tokens/s", f"{r['generated_tokens_per_s']:.1f}" if r["generated_tokens_per_s"] else "-"),
        ("documents/s", f"{r['documents_per_s']:.3f}"),
        ("total time (incl. tokenisation)", f"{r['total_s']:.2f} s"),
        ("peak memory", ", ".join(f"{k} {v:.2f} GiB" for k, v in r["peak_memory_gib"].items())),
        (
            "ROUGE-1 F1",
            f"{r['rouge1_f1']:.4f} ({r['rouge1_documents']} documents)"
            if r["rouge1_f1"] is not None
            else "-",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
