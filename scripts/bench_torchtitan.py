#!/usr/bin/env python
"""This trainer and PyPI torchtitan side by side: same shape, batch, sequence, AC, compile and float8, same GPU.

    python scripts/make_bench_tokenizer.py --out /tmp/tok                   # Llama 3's 128,256-entry vocabulary
    python scripts/bench_torchtitan.py --tokenizer /tmp/tok                 # 8B cut to 16 layers, 1 x 8192, all variants
    python scripts/bench_torchtitan.py --tokenizer /tmp/tok --shape 1B --variants compile
    python scripts/bench_torchtitan.py --tokenizer /tmp/tok --dry-run      # print both sides' command lines

Variants (--variants, comma-separated): eager, compile, compile-float8-tensorwise, compile-float8-rowwise.
Shapes (--shape): 8B-L<N> (Llama 3 8B's layer shape cut to N layers; 8B-L32 is the full 8B), 1B (Llama 3.2 1B
with an untied output head on both sides: torchtitan's llama3 model has no tied embeddings), debug (our debug
model's shape with the tokenizer's vocabulary). Neither registry is edited: the peer gets the shape as a flavor
registered at run time by scripts/torchtitan_peer.py; ours gets it from --model.* overrides.

Each variant runs ours then torchtitan (--repeat alternates the pair again), each in a fresh process on the
same device, on the same text (tests/assets/debug_corpus through the same tokenizer), AdamW (fused) with the
same hyperparameters, bf16 autocast over fp32 weights with one data-parallel rank, and the same selective
(per-op, "op") or full AC. Reported per run: tokens/s per device (median of the `--interval`-step log rows
after `--warmup` steps, each side's own interval figure), TFLOPS and MFU from this repository's FLOPs counter
(docs/metrics.md: 6N + 12*L*H*D*S, the convention both projects use) against the hardware table's dense bf16
peak and against a bf16 matmul (--matmul-size, 8192^3 on a GPU) measured in this invocation, before and after
the runs; the caching allocator's max reserved memory (each side's own figure; process RSS for ours on CPU);
time to first step (process start to the step-1 log line, wall clock, both sides alike); ratio ours/torchtitan.
torchtitan's trainer needs CUDA: on a machine without it the peer rows say so and ours still run.
Results: a table on stdout and <out>/results.json (<out>/runs.json after every run); each run's log in
<out>/<variant>-<side>-<n>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchtitan.errors import UserError  # noqa: E402  (no torch import: argument checks stay fast)

VARIANTS = {  # name -> (compile, float8 recipe or None)
    "eager": (False, None),
    "compile": (True, None),
    "compile-float8-tensorwise": (True, "tensorwise"),
    "compile-float8-rowwise": (True, "rowwise"),
}
SHAPE_DEFAULTS = {"8B": (1, 8192), "1B": (2, 8192), "debug": (8, 256)}  # local batch, seq
CORPUS = ROOT / "tests" / "assets" / "debug_corpus"
OURS_STEP1 = re.compile(r"\bstep\s+1\s+loss")
PEER_STEP1 = re.compile(r"step:\s*1\s+loss")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---- arguments -------------------------------------------------------------------------------------------------


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--shape", default="8B-L16", help="8B-L<N>, 1B or debug (default 8B-L16)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--sides", default="ours,torchtitan", help="ours, torchtitan or both (comma-separated)")
    p.add_argument("--tokenizer", help="folder with tokenizer.json (scripts/make_bench_tokenizer.py --out)")
    p.add_argument("--batch", type=int, help="local batch size (default: 1 for 8B-L*, 2 for 1B, 8 for debug)")
    p.add_argument("--seq-len", type=int, help="sequence length (default 8192; 256 for debug)")
    p.add_argument(
        "--ac", choices=["none", "selective", "full"], default="selective", help="selective = per-op"
    )
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--interval", type=int, default=10, help="log interval (steps) on both sides")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of tokens/s")
    p.add_argument("--repeat", type=int, default=1, help="run each (ours, torchtitan) pair this many times")
    p.add_argument(
        "--peer-path", default="/tmp/torchtitan_peer", help="where install_gpu_bundle.sh put torchtitan"
    )
    p.add_argument(
        "--matmul-size", type=int, help="bf16 matmul size for the measured peak (8192 GPU, 2048 CPU)"
    )
    p.add_argument("--out", default="outputs/bench_torchtitan", help="logs, run folders and results.json")
    p.add_argument(
        "--memory-snapshot",
        type=int,
        default=0,
        metavar="STEP",
        help="both sides dump a CUDA allocator snapshot (pytorch.org/memory_viz) at this step into their run\n"
        "folders, to compare where the memory goes; history recording slows the runs, so their tokens/s\n"
        "are not speed figures (0 = off)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="check the arguments, print both command lines, exit"
    )
    return p.parse_args(argv)


def check(a: argparse.Namespace) -> dict:
    """Validate the arguments without touching a device; return the plan (UserError: one line, exit 2)."""
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise UserError(f"--variants: unknown {', '.join(bad) or '(empty)'}; valid: {', '.join(VARIANTS)}")
    sides = [s for s in a.sides.split(",") if s]
    if not sides or set(sides) - {"ours", "torchtitan"}:
        raise UserError(f"--sides={a.sides!r}: valid values are ours, torchtitan or ours,torchtitan")
    m = re.fullmatch(r"8B-L(\d+)", a.shape)
    if m and not 1 <= int(m.group(1)) <= 32:
        raise UserError(f"--shape={a.shape}: the 8B has 32 layers; use 8B-L1 .. 8B-L32")
    if not m and a.shape not in ("1B", "debug"):
        raise UserError(f"--shape={a.shape!r}: valid shapes are 8B-L<N> (N = 1..32), 1B, debug")
    family = "8B" if m else a.shape
    batch = a.batch if a.batch is not None else SHAPE_DEFAULTS[family][0]
    seq = a.seq_len if a.seq_len is not None else SHAPE_DEFAULTS[family][1]
    for name, v in (("--batch", batch), ("--seq-len", seq), ("--steps", a.steps), ("--interval", a.interval)):
        if v <= 0:
            raise UserError(f"{name}={v} must be a positive integer")
    if a.memory_snapshot < 0 or a.memory_snapshot > a.steps:
        raise UserError(
            f"--memory-snapshot={a.memory_snapshot} must be a step of the run (1..{a.steps}) or 0"
        )
    if a.warmup < 0 or a.repeat < 1:
        raise UserError(f"--warmup={a.warmup} must be >= 0 and --repeat={a.repeat} >= 1")
    if a.steps % a.interval or a.steps - a.warmup < a.interval:
        raise UserError(
            f"--steps={a.steps} must be a multiple of --interval={a.interval} with at least one full interval"
            f" after --warmup={a.warmup} (e.g. --steps {a.warmup + 2 * a.interval})"
        )
    if any(VARIANTS[v][1] for v in variants) and (batch * seq) % 16:
        raise UserError(f"float8 needs batch x seq-len divisible by 16; got {batch} x {seq}")
    if not a.tokenizer:
        raise UserError(
            "--tokenizer is required: a folder with tokenizer.json (scripts/make_bench_tokenizer.py --out DIR)"
        )
    tok = Path(a.tokenizer) / "tokenizer.json"
    if not tok.is_file():
        raise UserError(
            f"--tokenizer={a.tokenizer}: {tok} does not exist (scripts/make_bench_tokenizer.py --out DIR)"
        )
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok)).get_vocab_size(with_added_tokens=True)
    from torchtitan.models import build_model_args

    if family == "8B":
        args = build_model_args("llama3", "8B", n_layers=int(m.group(1)))
    elif family == "1B":
        args = build_model_args("llama3", "1B", tie_embeddings=False)
    else:
        args = build_model_args("llama3", "debugmodel", vocab_size=vocab)
    if args.vocab_size != vocab:
        raise UserError(
            f"--tokenizer={a.tokenizer}: {vocab:,} entries, shape {a.shape} needs {args.vocab_size:,}"
            f" (scripts/make_bench_tokenizer.py --out DIR --vocab_size {args.vocab_size})"
        )
    if args.ffn_dim is not None:
        raise UserError(f"--shape={a.shape}: an exact FFN size cannot be given to torchtitan's llama3 args")
    if seq > args.max_seq_len:
        args.max_seq_len = seq  # both sides size the RoPE table to the sequence
    return {
        "variants": variants,
        "sides": sides,
        "shape": a.shape,
        "family": family,
        "batch": batch,
        "seq": seq,
        "args": args,
        "tokenizer": str(Path(a.tokenizer).resolve()),
    }


# ---- the two command lines -------------------------------------------------------------------------------------


def shared_flags(plan: dict, a: argparse.Namespace) -> list[str]:
    """The settings both trainers take under the same key names: batch, sequence, steps, precision, optimizer
    kernel and hyperparameters, learning-rate schedule, clipping, log interval and AC -- one list, so the two runs
    cannot drift apart.

    The hyperparameters are torchtitan 0.2.2's defaults, set explicitly on both sides: ours would otherwise take
    train_configs/debug_model.toml's (lr 3e-3, cosine decay to 0.1), which the debug model trains well with but
    which diverged on the 8B shape (a NaN gradient norm at step 3 with float8 rowwise on an H100, 2026-11-24),
    while the peer ran at 8e-4. Throughput does not depend on them; a run that stops does not give a figure."""
    flags = [
        f"--training.local_batch_size={plan['batch']}",
        f"--training.seq_len={plan['seq']}",
        f"--training.steps={a.steps}",
        "--training.mixed_precision_param=bfloat16",
        "--training.max_norm=1.0",
        "--optimizer.implementation=fused",
        "--optimizer.lr=8e-4",
        "--optimizer.eps=1e-8",
        "--optimizer.weight_decay=0.1",
        "--lr_scheduler.warmup_steps=2",
        "--lr_scheduler.decay_type=linear",
        "--lr_scheduler.min_lr_factor=0.0",
        f"--metrics.log_freq={a.interval}",
        f"--activation_checkpoint.mode={a.ac}",
    ]
    if a.ac == "selective":
        flags.append("--activation_checkpoint.selective_ac_option=op")
    return flags


def ours_command(plan: dict, a: argparse.Namespace, variant: str, dump: Path) -> list[str]:
    compile_, recipe = VARIANTS[variant]
    shape = {"8B": ["--model.flavor=8B", f"--model.n_layers={plan['args'].n_layers}"]}.get(plan["family"])
    if plan["family"] == "1B":
        shape = ["--model.flavor=1B", "--model.tie_embeddings=false"]
    if plan["family"] == "debug":
        shape = ["--model.flavor=debugmodel", f"--model.vocab_size={plan['args'].vocab_size}"]
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        f"--job.config_file={ROOT / 'train_configs' / 'debug_model.toml'}",
        *shape,
        f"--model.tokenizer_path={plan['tokenizer']}/tokenizer.json",
        f"--model.max_seq_len={plan['args'].max_seq_len}",
        *shared_flags(plan, a),
        "--metrics.enable_tensorboard=false",
        "--job.print_config=false",
    ]
    cmd.append(f"--compile.enable={str(compile_).lower()}")
    if recipe:
        cmd += ["--float8.enable=true", f"--float8.recipe={recipe}"]
    if a.memory_snapshot:  # -> <dump>/memory_snapshots/
        cmd.append(f"--profiling.memory_snapshot_steps={a.memory_snapshot}")
    return [*cmd, f"--job.dump_folder={dump}"]


def peer_flavor(plan: dict) -> dict:
    """Our ModelArgs as torchtitan 0.2.2's TransformerModelArgs fields (registered by scripts/torchtitan_peer.py)."""
    m = plan["args"]
    fields = {
        "dim": m.dim,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "n_kv_heads": m.n_kv_heads,
        "vocab_size": m.vocab_size,
        "multiple_of": m.multiple_of,
        "ffn_dim_multiplier": m.ffn_dim_multiplier,
        "norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "max_seq_len": m.max_seq_len,
    }
    if m.rope_scaling is not None:
        r = m.rope_scaling
        fields["rope_scaling_args"] = {
            "scaling_factor": r.factor,
            "low_freq_factor": r.low_freq_factor,
            "high_freq_factor": r.high_freq_factor,
            "original_max_position_embeddings": r.original_max_position_embeddings,
        }
    return {"name": f"bench_{plan['shape']}", "args": fields}


def peer_command(plan: dict, a: argparse.Namespace, variant: str, dump: Path) -> list[str]:
    """torchtitan 0.2.2's CLI (tyro: booleans are bare flags; its ConfigManager reads a list as one comma-separated value)."""
    compile_, recipe = VARIANTS[variant]
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "torchtitan_peer.py"),
        f"--job.dump_folder={dump}",
        "--model.name=llama3",
        f"--model.flavor={peer_flavor(plan)['name']}",
        f"--model.hf_assets_path={plan.get('peer_tokenizer', plan['tokenizer'])}",
        "--training.dataset=c4_test",
        f"--training.dataset_path={CORPUS}",
        *shared_flags(plan, a),
        "--metrics.disable_color_printing",
    ]
    if compile_:
        cmd += ["--compile.enable", "--compile.components=model,loss"]
    if recipe:
        # our filter keeps the output head in bf16 and converts every other linear of these shapes (>= 1024 wide)
        cmd += ["--model.converters=quantize.linear.float8", "--quantize.linear.float8.filter_fqns=output"]
        if recipe == "rowwise":
            cmd += ["--quantize.linear.float8.recipe_name=rowwise"]
    if a.memory_snapshot:
        # torchtitan 0.2.2 records the allocator history from the start and dumps at every profile_freq-th step
        # (tools/profiling.py) -> <dump>/memory_snapshot/iteration_<STEP>/
        cmd += ["--profiling.enable_memory_snapshot", f"--profiling.profile_freq={a.memory_snapshot}"]
    return cmd


def write_peer_tokenizer(plan: dict, out: Path) -> None:
    """The same tokenizer.json for the peer, plus the tokenizer_config.json its HuggingFaceTokenizer reads to add
    BOS/EOS to every document as ours does (without it the peer adds neither: same text, different tokens)."""
    folder = out / "peer_tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes((Path(plan["tokenizer"]) / "tokenizer.json").read_bytes())
    specials = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**specials, "add_bos_token": True, "add_eos_token": True})
    )
    plan["peer_tokenizer"] = str(folder)


def peer_env(plan: dict, a: argparse.Namespace) -> dict:
    with (
        socket.socket() as s
    ):  # a free port for the peer's one-rank process group (it always initializes one)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(Path(a.peer_path).resolve()),
        BENCH_TT_FLAVOR=json.dumps(peer_flavor(plan)),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    return env


# ---- running and reading -----------------------------------------------------------------------------------------


def run_logged(
    cmd: list[str], env: dict, cwd: Path, log: Path, step1: re.Pattern
) -> tuple[int, float | None]:
    """Run, streaming output to `log`; return the exit code and seconds from start to the step-1 line."""
    t0, first = time.perf_counter(), None
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        p = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in p.stdout:
            if first is None and step1.search(ANSI.sub("", line)):
                first = time.perf_counter() - t0
            f.write(line)
        return p.wait(), first


def ours_metrics(dump: Path) -> tuple[list[dict], float]:
    """Our run's metrics.jsonl rows and its peak memory in GiB (CUDA: max reserved; CPU: max RSS)."""
    rows = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    return rows, max(r.get("memory/max_reserved_gib", r.get("memory/max_rss_gib", 0.0)) for r in rows)


def ours_rows(dump: Path, a) -> tuple[list[dict], int | None]:
    rows, mem = ours_metrics(dump)
    timed = [
        r["throughput/tokens_per_sec_per_device"]
        for r in rows
        if r["step"] > a.warmup and r["step"] % a.interval == 0
    ]
    return timed, mem


def peer_rows(log: Path, a) -> tuple[list[float], float]:
    from torchtitan.estimate.torchtitan_log import step_rows  # the estimator's reader of torchtitan logs

    rows = step_rows(log.read_text())
    mem = max((memory for _, _, memory in rows), default=0.0)
    return [tps for step, tps, _ in rows if step > a.warmup and step % a.interval == 0], mem


def param_count(log: Path, side: str) -> int | None:
    text = ANSI.sub("", log.read_text())
    pat = r"model llama3 \S+: ([\d,]+) parameters" if side == "ours" else r"size: ([\d,]+) total parameters"
    m = re.search(pat, text)
    return int(m.group(1).replace(",", "")) if m else None


def cold_caches(dump: Path) -> dict:
    """Compile caches of this run alone: Inductor's (FX graphs, autotuning) and Triton's (kernel binaries) persist
    across processes under /tmp by default, so the run that compiles second can reuse kernels the first one built and
    its first step look faster (in the 2026-11-24 H100 runs ours compiled first in every variant). Each run starts
    cold, as a fresh machine does."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(dump / "inductor_cache"),
        "TRITON_CACHE_DIR": str(dump / "triton_cache"),
    }


def one_run(plan, a, variant: str, side: str, n: int, out: Path, cuda: bool) -> dict:
    dump = out / f"{variant}-{side}-{n}"
    log = out / f"{variant}-{side}-{n}.log"
    dump.mkdir(parents=True, exist_ok=True)
    if side == "torchtitan" and not cuda:
        return {"skipped": "torchtitan's trainer needs CUDA (none on this machine)"}
    if side == "ours":
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", HF_DATASETS_OFFLINE="1")
        env.update(cold_caches(dump))
        code, first = run_logged(ours_command(plan, a, variant, dump), env, ROOT, log, OURS_STEP1)
    else:
        env = {**peer_env(plan, a), **cold_caches(dump)}
        code, first = run_logged(peer_command(plan, a, variant, dump), env, dump, log, PEER_STEP1)
    res = {"log": str(log), "exit": code, "first_step_s": first, "parameters": param_count(log, side)}
    if code != 0:
        return {**res, "failed": f"exit {code}, see {log}"}
    try:
        tps, mem = ours_rows(dump, a) if side == "ours" else peer_rows(log, a)
    except (OSError, ValueError, KeyError) as e:
        return {**res, "failed": f"no figures ({e}), see {log}"}
    if not tps:
        return {**res, "failed": f"no log row after warm-up, see {log}"}
    return {**res, "tokens_per_sec": statistics.median(tps), "intervals": tps, "peak_memory_gib": mem}


def main(argv=None) -> int:
    a = parse(argv)
    try:
        plan = check(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    plan["peer_tokenizer"] = str(
        out / "peer_tokenizer"
    )  # written by write_peer_tokenizer before the first run
    if a.dry_run:
        for v in plan["variants"]:
            for side in plan["sides"]:
                dump = out / f"{v}-{side}-1"
                cmd = ours_command(plan, a, v, dump) if side == "ours" else peer_command(plan, a, v, dump)
                print(f"# {v}, {side}")
                if side == "torchtitan":
                    print(
                        f"BENCH_TT_FLAVOR='{json.dumps(peer_flavor(plan))}' PYTHONPATH={a.peer_path}", end=" "
                    )
                print(" ".join(cmd))
        return 0

    import torch

    from torchtitan.metrics.hardware import calibrate_tflops, device_spec, match_device

    cuda = torch.cuda.is_available()
    if (
        "torchtitan" in plan["sides"]
        and cuda
        and not (Path(a.peer_path) / "torchtitan" / "train.py").is_file()
    ):
        print(
            f"error: --peer-path={a.peer_path} holds no torchtitan (run scripts/install_gpu_bundle.sh)",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    write_peer_tokenizer(plan, out)
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    key = match_device(name) if cuda else None
    table = device_spec(key).bf16_tflops if key else None
    size = a.matmul_size or (8192 if cuda else 2048)
    mm = [calibrate_tflops(device, torch.bfloat16, seconds=2.0, size=size)]
    fpt = plan["args"].flops_per_token(plan["seq"])
    print(
        f"device {name} (table peak {table or 'n/a'} TFLOPS bf16); bf16 {size}^3 matmul {mm[0]:.1f} TFLOPS; "
        f"shape {plan['shape']} ({plan['args'].num_params() / 1e9:.2f} B parameters), {plan['batch']} x {plan['seq']}, "
        f"AC {a.ac}; {fpt / 1e9:.2f} GFLOP/token",
        flush=True,
    )
    runs = {v: {s: [] for s in plan["sides"]} for v in plan["variants"]}
    for n in range(1, a.repeat + 1):
        for v in plan["variants"]:
            for side in plan["sides"]:  # ours, then the peer: alternating, so drift hits both alike
                r = one_run(plan, a, v, side, n, out, cuda)
                runs[v][side].append(r)
                (out / "runs.json").write_text(json.dumps(runs, indent=1))  # kept if a time limit stops us
                print(
                    f"{v:26s} {side:10s} #{n}: "
                    + (
                        f"{r['tokens_per_sec']:,.0f} tokens/s, {r['peak_memory_gib']:.1f} GiB, first step {r['first_step_s'] or 0:.1f} s"
                        if "tokens_per_sec" in r
                        else r.get("failed") or r.get("skipped")
                    ),
                    flush=True,
                )
    mm.append(calibrate_tflops(device, torch.bfloat16, seconds=2.0, size=size))
    mm_peak = statistics.mean(mm)

    def summary(rs: list[dict]) -> dict:
        ok = [r for r in rs if "tokens_per_sec" in r]
        if not ok:
            return {"error": (rs[0].get("failed") or rs[0].get("skipped")) if rs else "not run"}
        tps = statistics.median(r["tokens_per_sec"] for r in ok)
        tflops = tps * fpt / 1e12
        return {
            "tokens_per_sec": tps,
            "tflops": tflops,
            "mfu_table_pct": 100 * tflops / table if table else None,
            "mfu_matmul_pct": 100 * tflops / mm_peak,
            "peak_memory_gib": max(r["peak_memory_gib"] for r in ok),
            "first_step_s": statistics.median(r["first_step_s"] for r in ok if r["first_step_s"] is not None)
            if any(r["first_step_s"] is not None for r in ok)
            else None,
            "parameters": ok[0]["parameters"],
            "runs_tokens_per_sec": [round(r["tokens_per_sec"]) for r in ok],
        }

    result = {
        "device": name,
        "torch": torch.__version__,
        "table_peak_tflops": table,
        "matmul_tflops": mm,
        "shape": plan["shape"],
        "batch": plan["batch"],
        "seq_len": plan["seq"],
        "ac": a.ac,
        "flops_per_token": fpt,
        "variants": {},
    }
    print(
        "\n| variant | side | tokens/s | TFLOPS | MFU table | MFU matmul | peak GiB | first step s | ours/torchtitan |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for v in plan["variants"]:
        s = {side: summary(runs[v][side]) for side in plan["sides"]}
        o, p = s.get("ours", {}), s.get("torchtitan", {})
        ratio = (
            o["tokens_per_sec"] / p["tokens_per_sec"]
            if "tokens_per_sec" in o and "tokens_per_sec" in p
            else None
        )
        if o.get("parameters") and p.get("parameters") and o["parameters"] != p["parameters"]:
            s["shape_mismatch"] = f"ours {o['parameters']:,} parameters, torchtitan {p['parameters']:,}"
        result["variants"][v] = {**s, "ratio_tokens_per_sec": ratio}
        for side, r in s.items():
            if side == "shape_mismatch":
                continue
            if "error" in r:
                print(f"| {v} | {side} | {r['error']} | | | | | | |")
                continue
            mfu_t = f"{r['mfu_table_pct']:.1f} %" if r["mfu_table_pct"] is not None else "n/a"
            first = f"{r['first_step_s']:.1f}" if r["first_step_s"] is not None else "n/a"
            rr = f"{ratio:.3f}" if ratio and side == "ours" else ""
            print(
                f"| {v} | {side} | {r['tokens_per_sec']:,.0f} | {r['tflops']:.1f} | {mfu_t} | {r['mfu_matmul_pct']:.1f} % "
                f"| {r['peak_memory_gib']:.1f} | {first} | {rr} |"
            )
        if "shape_mismatch" in s:
            print(f"warning: {v}: shapes differ: {s['shape_mismatch']}")
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
