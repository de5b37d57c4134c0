"""Decode speed: our KV-cache generation against Hugging Face transformers' `generate` on the same weights.

    python scripts/bench_generate.py --shape debug --batch 1 8 --repeat 5
    python scripts/bench_generate.py --shape 1B --layers 4 --batch 1 4 --repeat 3
    python scripts/bench_generate.py --shape debug --batch 8 --variants ours ours-int8 ours-int8-compile
    python scripts/bench_generate.py --shape 1B --layers 2 --batch 1 4 --variants ours ours-torch-kernels

Our variants load as scripts/generate.py does: bf16 on a CPU without bf16 instructions takes the kernels of
torchtitan/parallel/cpu_bf16.py (training.cpu_bf16_fp32_kernels); `ours-torch-kernels` is ours with them off.

One random LlamaForCausalLM (transformers' own init) is built for the shape; our model gets the same tensors
through the converter (torchtitan/checkpoint/hf.py), in the same dtype, on the same threads. Every prompt has
the same length (no padding, so transformers takes its fastest path) and every run generates exactly
--new tokens (EOS cannot stop it: transformers gets min_new_tokens, ours an EOS id that never occurs).

Decode tokens/s = batch * (new - 1) / (T(new) - T(1)), where T(n) is the wall time of one generate call for n
new tokens (prefill + n - 1 decode steps): the same definition for both implementations, prefill excluded.
Variants run in turn (A B A B ...) and the ratio to transformers is taken run by run, then the median.
Decode ms/step = 1000 * batch / (decode tokens/s): the latency of one decode step for the whole batch.

The last column is the analytic estimator's predicted decode ms/step (torchtitan/estimate) for the same shape,
batch, prompt length, new tokens and weight dtype, next to the measured one. A CPU has no datasheet: give its
rates with --peak_tflops and --hbm_gbps (`python -m torchtitan.estimate --estimate.hardware=cpu
--estimate.calibrate=true` measures them), else the column reads "n/a". On a GPU (--device cuda, the default
when one is present) both run there and the estimator uses the device's datasheet row.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.checkpoint.hf import hf_config_from_model_args, hf_to_ours  # noqa: E402
from torchtitan.generate import generate, make_decode_step, quantize_weights  # noqa: E402
from torchtitan.generate.loader import DTYPES, model_from_state_dict  # noqa: E402
from torchtitan.models.llama3 import get_model_args  # noqa: E402
from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels  # noqa: E402

VARIANTS = ("ours", "ours-int8", "ours-compile", "ours-int8-compile", "ours-torch-kernels", "hf")


def build(shape: str, layers: int | None, dtype: torch.dtype, variants: list[str], device: torch.device):
    import transformers

    args = get_model_args("debugmodel" if shape == "debug" else shape, max_seq_len=2048)
    if layers is not None:
        args.n_layers = layers
    cfg = hf_config_from_model_args(args, str(dtype).removeprefix("torch."))
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="sdpa"))
    hf = hf.to(device=device, dtype=dtype).eval()
    models = {"hf": hf}
    for v in variants:
        if v == "hf":
            continue
        sd = hf_to_ours({k: t.clone() for k, t in hf.state_dict().items()}, args)
        model = model_from_state_dict(args, sd, device, dtype)
        if "int8" in v:
            quantize_weights(model, "int8")
        # as scripts/generate.py does (bf16 on a CPU without bf16 instructions; "torch-kernels": switched off)
        use_cpu_bf16_kernels(model, device.type, dtype, enabled="torch-kernels" not in v)
        models[v] = (model, make_decode_step(model, compile="compile" in v))
    return args, models


def estimator_decode_ms(args, batch: int, a, weight_dtype: str) -> float | str:
    """The estimator's predicted latency of one decode step (ms) for this shape and batch on this device, or why
    there is none (a CPU needs --peak_tflops and --hbm_gbps: no datasheet)."""
    from torchtitan.config.job_config import Estimate
    from torchtitan.generate.benchmark import predicted_latency

    est = Estimate(peak_tflops=a.peak_tflops, hbm_bandwidth_gbps=a.hbm_gbps)
    device = torch.device(a.device)
    p = predicted_latency(est, args, device, 1, batch, a.prompt_len, a.new, weight_dtype)
    return p.get("decode_ms_per_token", "n/a")


def time_call(variant: str, models: dict, prompts: torch.Tensor, new: int, cache_len: int) -> float:
    t0 = time.perf_counter()
    if variant == "hf":
        with torch.no_grad():
            models["hf"].generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=0,
            )
    else:
        model, step = models[variant]
        compiled = "compile" in variant  # one cache length for every call: fixed shapes, no recompilation
        out = generate(
            model,
            prompts.tolist(),
            new,
            eos_id=-1,
            decode_step=step,
            cache_len=cache_len,
            static_shapes=compiled,
        )
        assert all(len(t) == new for t in out.tokens)
    if prompts.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="debug", help="debug, or a flavor (1B, 3B, 8B) cut to --layers layers")
    p.add_argument("--layers", type=int, default=None, help="keep only this many layers")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--new", type=int, default=64, help="new tokens per generate call")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=["ours", "hf"])
    p.add_argument(
        "--peak_tflops", type=float, default=None, help="this CPU's peak, for the estimator column"
    )
    p.add_argument(
        "--hbm_gbps", type=float, default=None, help="this CPU's memory bandwidth (GB/s), likewise"
    )
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    variants = list(dict.fromkeys([*a.variants, "hf"]))  # transformers is the yardstick of every ratio
    device = torch.device(a.device)
    args, models = build(a.shape, a.layers, DTYPES[a.dtype], variants, device)
    print(
        f"# shape {a.shape} ({args.n_layers} layers, dim {args.dim}, vocab {args.vocab_size},"
        f" {args.num_params() / 1e6:.1f}M params), {a.dtype}, prompt {a.prompt_len}, new {a.new},"
        f" {torch.cuda.get_device_name(device) if device.type == 'cuda' else f'{torch.get_num_threads()} threads'},"
        f" torch {torch.__version__}",
        flush=True,
    )
    print(
        "| batch | variant | decode tokens/s (median) | runs | ratio to transformers (median of runs)"
        " | decode ms/step (median) | estimator predicted ms/step |"
    )
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: |")
    for batch in a.batch:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(3, args.vocab_size, (batch, a.prompt_len), generator=g).to(device)
        cache_len = a.prompt_len + a.new
        for v in variants:  # warm-up (and compilation)
            time_call(v, models, prompts, 4, cache_len)
        rates = {v: [] for v in variants}
        for _ in range(a.repeat):
            for v in variants:
                t1 = time_call(v, models, prompts, 1, cache_len)
                tn = time_call(v, models, prompts, a.new, cache_len)
                rates[v].append(batch * (a.new - 1) / (tn - t1))
        for v in variants:
            ratios = [r / h for r, h in zip(rates[v], rates["hf"])]
            rate = statistics.median(rates[v])
            predicted = estimator_decode_ms(args, batch, a, "int8" if "int8" in v else a.dtype)
            print(
                f"| {batch} | {v} | {rate:.1f} | {', '.join(f'{r:.1f}' for r in rates[v])}"
                f" | {statistics.median(ratios):.2f} | {1000 * batch / rate:.2f}"
                f" | {predicted if isinstance(predicted, str) else f'{predicted:.2f}'} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
