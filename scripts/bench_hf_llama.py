#!/usr/bin/env python
"""NVIDIA cudnn-frontend's Llama-3.2-1B training benchmark, run again on the device at hand, beside the estimate
of the same flags and the figures it published (tests/estimate_reference.toml, source cudnn_frontend_llama32_1b).

    python scripts/bench_hf_llama.py --dry-run                    # the configurations and the estimator's flags
    python scripts/bench_hf_llama.py --out /tmp/hf                # on a GPU (docs/performance.md, command n)

The published loop (NVIDIA/cudnn-frontend 7606332, benchmark/Llama-3.2-1B-Training/training_perf.py): Hugging
Face's LlamaForCausalLM built from Llama-3.2-1B's config with random weights, every tensor bf16 (no autocast, no
fp32 copy), inputs_embeds of randn and an all-ones attention mask, torch's CrossEntropyLoss on the bf16 logits,
SGD (lr 1e-6, torch's foreach default), eager, under `sdpa_kernel` with one backend; 5 warm-up iterations, then the
mean of the timed ones. Its published rows read two ways (docs/estimate_log.md, "cudnn-frontend's 1B rows: two
readings"): with the H200 locked at 1500 MHz as its README says, the estimate's non-attention fits the H200 rows and
its attention is 1.36-1.43x too slow at every length with either backend, against the clock's physics; with the
H200 at its free clock (the B200's log shows its lock refused), HF's non-attention runs 18-19 % slower than
estimated on the H200 and 23-26 % on the B200. This run tells them apart on a known clock: the same loop on this
device, each configuration's SM clock and power sampled by nvidia-smi while it runs, and (--profile) one profiled
iteration per listed configuration summed into the estimator's terms (torchtitan/estimate/trace_terms.py) beside
the estimate's terms for this device.

Output: a table on stdout; results.json (and with --profile the traces, gzipped, and their term tables) in --out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The published loop's configurations (batch, sequence) and its three backends' names; EFFICIENT_ATTENTION is
# not run (the estimator has no rates for torch's memory-efficient kernel).
CONFIGS = ((24, 768), (12, 1024), (6, 2048), (3, 4096), (2, 8192), (1, 16384))
BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "math": "MATH"}
SOURCE = "cudnn_frontend_llama32_1b"  # the published rows, read from tests/estimate_reference.toml
# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B), which the published loop loads from the Hub; "tiny" is a
# 2-layer stand-in of the same kind for a CPU check of the script.
LLAMA32_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
    tie_word_embeddings=True, hidden_act="silu", attention_bias=False, mlp_bias=False,
)  # fmt: skip
TINY = {**LLAMA32_1B, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}  # fmt: skip


class BenchError(Exception):
    """A bad argument: one line, exit 2."""


def published_s() -> dict[str, dict[tuple[str, int, int], float]]:
    """The source's published seconds per iteration by part ("H200": locked at 1500 MHz per its README; "B200": its
    free clock per its log) and (backend, batch, seq): batch x seq / the reference rows' tokens/s."""
    from torchtitan.estimate.validation import load_reference

    out: dict[str, dict] = {}
    for row in load_reference()["training"]:
        m = re.match(r"^(h200|b200)_.*_b(\d+)_s(\d+)_(cudnn|flash)_", row["id"])
        if row["source"] == SOURCE and m:
            b, s = int(m[2]), int(m[3])
            out.setdefault(m[1].upper(), {})[(m[4], b, s)] = b * s / row["tokens_per_sec"]
    return out


def estimate_flags(batch: int, seq: int, backend: str) -> list[str]:
    """The estimator's flags for one configuration: the reference file's mapping of this source, without the
    hardware (added for the device at hand)."""
    return [
        "--model.flavor=1B", f"--training.seq_len={seq}", f"--training.local_batch_size={batch}",
        "--activation_checkpoint.mode=none", "--compile.enable=false", "--training.max_norm=0",
        "--estimate.num_devices=1", f"--estimate.attention_backend={backend}", "--estimate.model_dtype=bfloat16",
        "--estimate.optimizer=sgd", "--estimate.eager_loss=bf16", "--estimate.eager_rms_norm=composite",
        "--estimate.accuracy=false",
    ]  # fmt: skip


def parse_configs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        try:
            b, s = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise BenchError(f"--configs: {item!r} is not BATCHxSEQ (e.g. 6x2048)") from None
        if b < 1 or s < 2:
            raise BenchError(f"--configs: {item!r} needs a batch >= 1 and a sequence >= 2")
        out.append((b, s))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ",".join(f"{b}x{s}" for b, s in CONFIGS)
    p.add_argument("--configs", default=default, help=f"BATCHxSEQ list (default: the published {default})")
    p.add_argument("--backends", default="cudnn,flash", help=f"SDPA backends of {', '.join(BACKENDS)}")
    p.add_argument("--warmup", type=int, default=5, help="iterations before timing (published: 5)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (published: 100)")
    p.add_argument(
        "--profile",
        default=None,
        help="BATCHxSEQ list to profile one iteration of ('' none; default: 6x2048 and 1x16384 if run)",
    )
    p.add_argument(
        "--model", choices=("1B", "tiny"), default="1B", help="tiny: a 2-layer stand-in (CPU check)"
    )
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a check of the script")
    p.add_argument("--out", help="write results.json (and the profiled traces) here")
    p.add_argument("--dry-run", action="store_true", help="print the configurations and flags, run nothing")
    a = p.parse_args(argv)
    a.configs = parse_configs(a.configs)
    if a.profile is None:
        a.profile = [c for c in ((6, 2048), (1, 16384)) if c in a.configs]
    else:
        a.profile = parse_configs(a.profile) if a.profile else []
    a.backends = [x for x in a.backends.split(",") if x]
    bad = [x for x in a.backends if x not in BACKENDS]
    if bad or not a.backends:
        raise BenchError(f"--backends: {','.join(bad) or 'empty'}; valid: {', '.join(BACKENDS)}")
    if a.warmup < 0 or a.iters < 1:
        raise BenchError(f"--warmup {a.warmup} / --iters {a.iters}: need warmup >= 0 and iters >= 1")
    missing = [f"{b}x{s}" for b, s in a.profile if (b, s) not in a.configs]
    if missing:
        raise BenchError(f"--profile {','.join(missing)}: not in --configs")
    return a


def estimate(device_name: str, batch: int, seq: int, backend: str) -> dict | None:
    """The estimator's JSON for this configuration on this device (None where it has no rates for the device)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "est.json"
        hw = f"--estimate.hardware={device_name}"
        cmd = [sys.executable, "-m", "torchtitan.estimate", *estimate_flags(batch, seq, backend), hw,
               f"--estimate.json={out}"]  # fmt: skip
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            return None
        return json.loads(out.read_text())


class Sampler:
    """nvidia-smi's SM clock (MHz) and power draw (W) every 100 ms while a configuration runs (nothing without it)."""

    def __init__(self, enabled: bool):
        self.proc = None
        if enabled and shutil.which("nvidia-smi"):
            self.file = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                 "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=self.file, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.terminate()
        self.proc.wait()
        self.file.seek(0)
        rows = []
        for line in self.file.read().splitlines():
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError:
                continue
        self.file.close()
        if not rows:
            return {}
        clock, power, temp = zip(*rows)
        return {"sm_clock_mhz_median": statistics.median(clock), "sm_clock_mhz_min": min(clock),
                "power_w_median": statistics.median(power), "power_w_max": max(power),
                "temperature_c_max": max(temp), "samples": len(rows)}  # fmt: skip


def build_model(kind: str, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**(LLAMA32_1B if kind == "1B" else TINY))
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).train()
    return model, config


def run_config(model, config, batch, seq, backend, a, profile_dir: Path | None) -> dict:
    """Seconds per iteration of the published loop at (batch, seq) with one SDPA backend; with `profile_dir`, one
    more iteration recorded by torch.profiler (a ProfilerStep# mark around it) into a Chrome trace there."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    embeds = torch.randn(batch, seq, config.hidden_size, dtype=torch.bfloat16, device=dev)
    mask = torch.ones(batch, seq, dtype=torch.int64, device=dev)
    target = torch.randint(2, config.vocab_size - 2, (batch, seq), dtype=torch.int64, device=dev)

    def step():
        logits = model.forward(inputs_embeds=embeds, attention_mask=mask).logits
        loss = loss_fn(logits.view(-1, config.vocab_size), target.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    with sdpa_kernel(backends=[getattr(SDPBackend, BACKENDS[backend])]):
        for _ in range(a.warmup):
            step()
        sync()
        sampler = Sampler(dev.type == "cuda")
        t0 = time.perf_counter()
        for _ in range(a.iters):
            step()
        sync()
        seconds = (time.perf_counter() - t0) / a.iters
        res = {"batch": batch, "seq": seq, "backend": backend, "s_per_iter": seconds,
               "tokens_per_s": batch * seq / seconds, **sampler.stop()}  # fmt: skip
        if profile_dir is not None:
            from torch.profiler import ProfilerActivity, profile, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            trace = profile_dir / f"hf_{backend}_{batch}x{seq}.json"
            with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=1),
                         on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:  # fmt: skip
                for _ in range(2):
                    step()
                    sync()
                    prof.step()
            res["trace"] = str(trace)
    return res


def fmt_row(r: dict, published: dict | None) -> str:
    pub = published.get((r["backend"], r["batch"], r["seq"])) if published else None
    est = r.get("estimate_s")
    cells = [f"{r['batch']:>3}x{r['seq']:<6}", f"{r['backend']:<6}", f"{r['s_per_iter'] * 1e3:9.1f}",
             f"{pub * 1e3:9.1f}" if pub else f"{'':>9}", f"{est * 1e3:9.1f}" if est else f"{'':>9}",
             f"{(est / r['s_per_iter'] - 1) * 100:+7.1f}%" if est else f"{'':>8}",
             f"{r['sm_clock_mhz_median']:7.0f}" if "sm_clock_mhz_median" in r else f"{'':>7}",
             f"{r['power_w_median']:6.0f}" if "power_w_median" in r else f"{'':>6}"]  # fmt: skip
    return " ".join(cells)


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse(argv)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        for b, s in a.configs:
            for be in a.backends:
                print(f"{b}x{s} {be}: python -m torchtitan.estimate {' '.join(estimate_flags(b, s, be))}"
                      " --estimate.hardware=<this device>")  # fmt: skip
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here (--dry-run lists the runs; --device cpu checks the script)",
              file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    published = next((v for k, v in published_s().items() if k in name.upper().split()), None)
    out = Path(a.out) if a.out else None
    traces = Path(tempfile.mkdtemp(prefix="hf_traces_"))
    model, config = build_model(a.model, device)
    head = (f"{name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, model {a.model};"
            f" {a.warmup} warm-up + {a.iters} timed iterations")  # fmt: skip
    print(head)
    print(f"{'config':<10} {'backend':<6} {'ms/iter':>9} {'published':>9} {'estimate':>9} {'est/meas':>8}"
          f" {'SM MHz':>7} {'W':>6}")  # fmt: skip
    results = []
    for b, s in a.configs:
        for be in a.backends:
            try:
                r = run_config(model, config, b, s, be, a, traces if (b, s) in a.profile else None)
            except RuntimeError as e:  # a backend this device or build cannot run: recorded, the rest go on
                r = {"batch": b, "seq": s, "backend": be, "error": str(e).splitlines()[0][:200]}
                print(f"{b:>3}x{s:<6} {be:<6} failed: {r['error']}")
                results.append(r)
                continue
            est = estimate(name, b, s, be) if a.model == "1B" and device.type == "cuda" else None
            if est:
                r["estimate_s"] = est["step_time_s"]
                r["estimate_terms"] = {**est["compute_detail_s"], **est["step_time_breakdown_s"]}
            if "trace" in r:
                from torchtitan.estimate.trace_terms import compare, trace_terms

                r["measured_terms"] = trace_terms(r["trace"])
                r["terms_table"] = compare(r["measured_terms"], est)
            results.append(r)
            print(fmt_row(r, published))
    for r in results:
        if "terms_table" in r:
            print(f"\n{r['batch']}x{r['seq']} {r['backend']}, one profiled iteration against the estimate:")
            print("\n".join(r["terms_table"]))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        for r in results:
            if "trace" in r:
                src = Path(r["trace"])
                with src.open("rb") as f, gzip.open(out / (src.name + ".gz"), "wb") as g:
                    shutil.copyfileobj(f, g)
                r["trace"] = src.name + ".gz"
        doc = {"device": name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "model": a.model, "warmup": a.warmup, "iters": a.iters, "runs": results}  # fmt: skip
        (out / "results.json").write_text(json.dumps(doc, indent=1))
    shutil.rmtree(traces, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
