#!/usr/bin/env python
"""One simulated rank of a full-size layout on this device, ours and PyPI torchtitan's: memory and step time beside
the published run and our estimator.

    python scripts/make_bench_tokenizer.py --out /tmp/tok
    python scripts/bench_sim_ranks.py --tokenizer /tmp/tok                        # the memory rows (below)
    python scripts/bench_sim_ranks.py --tokenizer /tmp/tok --rows h100_8b_fsdp8_eager --dry-run
    python scripts/bench_sim_ranks.py --tokenizer /tmp/tok --rows f8nc --steps 5 --profile-rows \\
        h100_8b_s4096_fsdp8_no_ac_eager_f8nc                                     # step time (docs/performance.md, f)

Rows are published runs as tests/estimate_reference.toml records them (its `args`, in our keys, `memory_gib`,
`tokens_per_sec`), by id or by set: `memory` (the default) = h100_8b_fsdp8_eager (8B FSDP 8, 2 x 8192,
selective AC: 82.4 GiB), h100_70b_fsdp32_tp8 (70B FSDP 32 x TP 8, 16 x 8192, full AC, compile, float8: 71.9 GiB),
h100_405b_fsdp8_tp8_pp8_1f1b (405B FSDP 8 x TP 8 x PP 8: 82.5 GiB; 96 GB parts, so it may not fit an 80 GB H100);
`f8nc` = the six rows of torchao's float8nocompile table (8B FSDP 8, 1 x 4096; no AC / AC every 2nd layer / full
AC; bf16 eager / float8 + compile; foreach AdamW), `f8nc_eager` and `f8nc_float8` its two halves. A row spec `ID+--key=value[+--key=value]` appends overrides to
that row (a variant: `h100_8b_s4096_fsdp8_no_ac_eager_f8nc+--optimizer.implementation=fused`); --extra-args
appends overrides to every row (before a row's own). Both reach both sides and the estimator.

Each side runs rank 0 of the row's world in one process with fake process groups (ours: --comm.mode=fake_backend
--comm.fake_world_size=N, docs/launching.md; torchtitan: NGPU=N --comm.mode=fake_backend, its own), --steps
steps, one log row per step. Reported:
- memory: each side's max reserved memory (its own log), ours/torchtitan, the published figure and our
  estimator's (simulation.json's estimated_gib);
- step time, the median over the steady steps (--warmup steps left out): ours from simulation.json's
  step_times_s (each step between two torch.cuda.synchronize calls: compute and the host time the step exposes,
  no communication), torchtitan from its log rows (its local tokens per step / its tps: the wall time between two
  log rows); the published step of the real N-GPU run (the row's tokens per device and step / its tokens/s); our
  estimator's full step for the row as published (its part, e.g. 96 GB / 500 W H100s, and its estimate args: the
  validation figure, tests/estimate_reference.toml) and, on this device, what a simulated rank contains (compute
  with recompute and FSDP2's copies, optimizer, their sum: no communication; simulation.json's estimated_step_s for
  ours, the same estimator call here for torchtitan).
--profile-rows: ours records one steady step of those rows with the trainer's profiler (--profiling.*): the run
gets two more steps, the last recorded and the one before it its profiler warm-up (both left out of the step
time); the Chrome trace comes back gzipped as <out>/<row>-ours-step<N>.trace.json.gz (Perfetto reads it as is).
torchtitan's keys are translated from ours (same names for batch, sequence, parallel degrees, AC, compile,
optimizer implementation; --float8.enable=true -> its float8 converter with the output head kept in bf16, as
ours). SIGTERM (e.g. `timeout`) stops the run in progress and still prints the tables and writes results.json
(also written after every row).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_torchtitan import ours_metrics, write_peer_tokenizer  # noqa: E402

from torchtitan.errors import UserError  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROW_SETS = {
    "memory": ["h100_8b_fsdp8_eager", "h100_70b_fsdp32_tp8", "h100_405b_fsdp8_tp8_pp8_1f1b"],
    **{
        name: [
            f"h100_8b_s4096_fsdp8_{ac}_{kind}_f8nc"
            for kind in kinds
            for ac in ("no_ac", "sac_layer", "full_ac")
        ]
        for name, kinds in (
            ("f8nc", ("eager", "compile_float8")),
            ("f8nc_eager", ("eager",)),
            ("f8nc_float8", ("compile_float8",)),
        )
    },
}
ROWS = ROW_SETS["memory"]
SAME = (
    "--model.flavor",
    "--training.seq_len",
    "--training.local_batch_size",
    "--parallelism.",
    "--activation_checkpoint.",
    "--optimizer.implementation",  # the same key and values (for-loop/foreach/fused) in torchtitan 0.2.2
)

FLOAT8_FLAGS = ("--float8.enable_fsdp_float8_all_gather", "--float8.precompute_float8_dynamic_scale_for_fsdp")


class Stopped(Exception):
    """SIGTERM arrived (the command's time limit): stop the run in progress, report what is done."""


def reference_rows() -> dict:
    data = tomllib.loads((ROOT / "tests" / "estimate_reference.toml").read_text())
    return {r["id"]: r for r in data["training"]}


# torchtitan 0.2.2's float8 converter on every linear but the output head, as ours
PEER_FLOAT8 = ["--model.converters=quantize.linear.float8", "--quantize.linear.float8.filter_fqns=output"]


def peer_args(ours: list[str]) -> list[str]:
    """Our override keys as torchtitan 0.2.2's command line."""
    out = []
    for arg in ours:
        key, _, value = arg.partition("=")
        if arg.startswith(SAME):
            out.append(arg)
        elif key == "--compile.enable":
            out += ["--compile.enable"] if value == "true" else []
        elif key == "--compile.components":
            out.append(arg)
        elif arg == "--float8.enable=true":
            out += PEER_FLOAT8
        elif arg == "--float8.enable=false":  # a variant turning a row's float8 off
            out = [x for x in out if x not in PEER_FLOAT8]
        elif key in FLOAT8_FLAGS and value == "true":  # the same switches, under its quantize section
            out.append(f"--quantize.linear.float8.{key.split('.')[-1]}")
        else:
            raise UserError(f"no torchtitan equivalent known for {arg}")
    return out


def row_specs(rows: str, extra: list[str], refs: dict) -> dict[str, tuple[dict, list[str]]]:
    """--rows as {label: (reference row, our args)}: set names expanded, `ID+--key=value` overrides appended."""
    out = {}
    for spec in [x for x in rows.split(",") if x]:
        for one in ROW_SETS.get(spec, [spec]):
            rid, *overrides = one.split("+")
            if rid not in refs:
                raise UserError(
                    f"--rows: unknown {rid}; valid: tests/estimate_reference.toml ids or {', '.join(ROW_SETS)}"
                )
            bad = [o for o in overrides if not re.fullmatch(r"--[\w.]+=\S*", o)]
            if bad:
                raise UserError(
                    f"--rows: {one}: overrides after + must read --section.key=value, not {bad[0]}"
                )
            label = rid + "".join("+" + re.sub(r"[^\w.-]", "-", o[2:]) for o in overrides)
            out[label] = (refs[rid], [*refs[rid]["args"], *extra, *overrides])
    if not out:
        raise UserError("--rows is empty; valid: tests/estimate_reference.toml ids or " + ", ".join(ROW_SETS))
    return out


def commands(label: str, row: dict, args: list[str], a, out: Path) -> tuple[list[str], list[str], dict]:
    n = row["num_devices"]
    dump = out / label
    steps = a.steps + (2 if label in a.profiled else 0)
    ours = [
        sys.executable,
        str(ROOT / "train.py"),
        f"--job.config_file={ROOT / 'train_configs' / 'debug_model.toml'}",
        *args,
        f"--model.tokenizer_path={Path(a.tokenizer).resolve()}/tokenizer.json",
        "--comm.mode=fake_backend",
        f"--comm.fake_world_size={n}",
        "--comm.fake_rank=0",
        f"--training.steps={steps}",
        "--metrics.log_freq=1",
        "--metrics.enable_tensorboard=false",
        "--job.print_config=false",
    ]
    if label in a.profiled:
        # torchtitan/profiling.py: wait profile_freq - 2 steps, warm up one, record one = the run's last step
        ours += ["--profiling.enable_profiling=true", f"--profiling.profile_freq={steps}"]
    ours.append(f"--job.dump_folder={dump}-ours")  # last: read back below
    peer = [
        sys.executable,
        str(ROOT / "scripts" / "torchtitan_peer.py"),
        *peer_args(args),
        f"--model.hf_assets_path={out / 'peer_tokenizer'}",
        "--training.dataset=c4_test",
        f"--training.dataset_path={ROOT / 'tests' / 'assets' / 'debug_corpus'}",
        "--comm.mode=fake_backend",
        f"--training.steps={a.steps}",
        "--metrics.log_freq=1",
        "--metrics.disable_color_printing",
        f"--job.dump_folder={dump}-torchtitan",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BENCH_TT_FLAVOR")}
    env.update(
        NGPU=str(n),  # torchtitan's fake mode: the world size
        LOCAL_RANK="0",  # its Trainer picks cuda:LOCAL_RANK (0.2.2: KeyError without it, checked on CPU)
        PYTHONPATH=str(Path(a.peer_path).resolve()),
        PYTHONUNBUFFERED="1",
        HF_DATASETS_OFFLINE="1",
    )
    return ours, peer, env


# ---- the estimator's figures (one FLOPs counter, one hardware table: torchtitan/estimate) ---------------------


def device_hardware(choice: str) -> str:
    """The hardware table entry the steps are priced on: --hardware, or (auto) this machine's CUDA device, else
    h100-sxm (what a dry run on a CPU machine previews). The device is named by a child process, so this one holds
    no CUDA context (its memory would be missing from the runs)."""
    if choice != "auto":
        return choice
    from torchtitan.metrics.hardware import match_device

    probe = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
    name = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    if not name:
        return "h100-sxm"
    if match_device(name) is None:
        print(f"warning: {name} is not in the hardware table: priced as an H100 SXM", file=sys.stderr)
    return match_device(name) or "h100-sxm"


def estimates(row: dict, args: list[str], hardware: str) -> dict:
    """Our estimator on this row: the published run (its part and estimate args: the validation figure) and one
    rank of the same config on `hardware` (the trainer's own estimate settings, as simulation.json prices it)."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import rank_step_parts, training_step_time
    from torchtitan.estimate.training import estimate_plan
    from torchtitan.estimate.validation import load_reference, training_cfg

    ref = load_reference()
    published = estimate_plan(build_plan(training_cfg(ref, dict(row, args=args))))
    # the row without its part and estimate args (they describe the published run's machines and software)
    here = dict(row, args=[*args, f"--estimate.hardware={hardware}"], part="", source="", estimate_args=[])
    plan = build_plan(training_cfg(ref, here))
    device = estimate_plan(plan)
    out = {
        # torchtitan's tps = this dp rank's tokens per step / seconds / (tp x pp x cp): its step time is read back
        "tokens_per_dp_rank_step": plan.accum * plan.local_batch * plan.seq_len,
        "non_dp_size": plan.dims.non_data_parallel_size,
        "estimated_full_step_s": published["step_time_s"],
        "hardware": device["hardware"]["name"],
        "estimated_step_s": rank_step_parts(training_step_time(plan)),
        "estimated_device_gib": device["memory_gib"],
        "estimated_device_fits": device["fits"],
    }
    if "tokens_per_sec" in row:
        # tokens per device and step / published tokens/s, with the estimator's definition of both
        per_step = published["step_time_s"] * published["tokens_per_sec_per_device"]
        out["published_step_s"] = per_step / row["tokens_per_sec"]
    return out


# ---- reading the runs --------------------------------------------------------------------------------------------


def steady(values: dict[int, float], warmup: int, steps: int) -> tuple[float | None, list[int]]:
    """Median over steps warmup+1 .. steps of {step: seconds}; and which steps those were."""
    used = sorted(s for s in values if warmup < s <= steps)
    return (statistics.median(values[s] for s in used) if used else None), used


def peer_step_seconds(log: Path, tokens: int, divisor: int) -> tuple[dict[int, float], list[float]]:
    """torchtitan 0.2.2's log rows as {step: seconds} (tokens / (tps x divisor)) and their memory figures."""
    from torchtitan.estimate.torchtitan_log import step_rows  # the estimator's reader of torchtitan logs

    rows = step_rows(log.read_text())
    secs = {step: tokens / (tps * divisor) for step, tps, _ in rows if tps > 0}
    return secs, [memory for _, _, memory in rows]


def ours_figures(dump: Path, res: dict, a, label: str, out: Path) -> None:
    rows, res["ours_gib"] = ours_metrics(dump)
    sim = json.loads((dump / "simulation.json").read_text())
    res["estimated_gib"] = sim.get("estimated_gib", {}).get("peak")
    times = dict(enumerate(sim.get("step_times_s", []), start=1))
    res["ours_step_s"], res["ours_steps_used"] = steady(times, a.warmup, a.steps)
    res["ours_step_times_s"] = list(times.values())
    wall = {x["step"]: x["time/step_s"] for x in rows if "time/step_s" in x}
    res["ours_log_step_s"], _ = steady(wall, a.warmup, a.steps)  # log row to log row, as torchtitan's figure
    if "estimated_step_s" in sim:
        res["ours_estimated_step_s"] = sim["estimated_step_s"]
    for trace in sorted((dump / "profile_traces").glob("*.json")):
        dest = out / f"{label}-ours-{trace.stem.split('_')[-1]}.trace.json.gz"
        with open(trace, "rb") as f, gzip.open(dest, "wb") as g:
            shutil.copyfileobj(f, g)
        res.setdefault("ours_traces", []).append(
            {
                "file": str(dest),
                "json_mib": trace.stat().st_size / 2**20,
                "gz_mib": dest.stat().st_size / 2**20,
            }
        )


def run(cmd, env, cwd, log: Path) -> int:
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


# ---- tables ------------------------------------------------------------------------------------------------------


def fmt(v, spec=".3f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "n/a"


def diff(x, y) -> str:
    return f"{x - y:+.3f}" if isinstance(x, (int, float)) and isinstance(y, (int, float)) else "n/a"


STEP_HEADER = (
    "| row | side | published s | est. full s (published part) | published - est. full | simulated s (steps)"
    " | est. compute s | est. optimizer s | est. no-comm s | simulated - est. no-comm |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def step_lines(label: str, res: dict, sides: list[str]) -> list[str]:
    """One line per side; ours twice: its steps between synchronizations (simulation.json) and, as torchtitan's
    figure, log row to log row (metrics.jsonl's time/step_s: the per-step logging between the steps included)."""
    lines = []
    shown_sides = [(s, s) for s in sides if s != "ours"]
    if "ours" in sides:
        shown_sides[:0] = [("ours", "ours"), ("ours_log", "ours, log to log")]
    for side, name in shown_sides:
        key = "ours" if side == "ours_log" else side
        est = res.get(f"{key}_estimated_step_s") or res.get("estimated_step_s", {})
        sim = res.get(f"{side}_step_s")
        used = res.get(f"{key}_steps_used") or []
        shown = (
            f"{fmt(sim)} ({used[0]}-{used[-1]})"
            if sim is not None and used
            else res.get(f"{key}_error", "n/a")
        )
        lines.append(
            f"| {label} | {name} | {fmt(res.get('published_step_s'))} | {fmt(res.get('estimated_full_step_s'))}"
            f" | {diff(res.get('published_step_s'), res.get('estimated_full_step_s'))} | {shown}"
            f" | {fmt(est.get('compute'))} | {fmt(est.get('optimizer'))} | {fmt(est.get('no_communication'))}"
            f" | {diff(sim, est.get('no_communication'))} |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--tokenizer", required=True, help="folder with a 128,256-entry tokenizer.json")
    p.add_argument(
        "--rows",
        default="memory",
        help="comma-separated tests/estimate_reference.toml ids (ID+--key=value: a variant) or sets:\n"
        + "; ".join(f"{k} = {len(v)} rows" for k, v in ROW_SETS.items()),
    )
    p.add_argument(
        "--extra-args", default="", help="overrides appended to every row (one shell-quoted string)"
    )
    p.add_argument("--sides", default="ours,torchtitan")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the step time (default 2)")
    p.add_argument(
        "--profile-rows", default="", help="rows (as in --rows) whose ours side records a steady step"
    )
    p.add_argument(
        "--hardware",
        default="auto",
        help="hardware table entry the rank's estimated step is priced on (auto: this CUDA device, else h100-sxm)",
    )
    p.add_argument("--peer-path", default="/tmp/torchtitan_peer")
    p.add_argument("--out", default="outputs/bench_sim_ranks")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print both command lines and the estimator's figures, then exit",
    )
    a = p.parse_args(argv)
    refs = reference_rows()
    try:
        extra = shlex.split(a.extra_args)
        bad = [x for x in extra if not x.startswith("--")]
        if bad:
            raise UserError(f"--extra-args: {bad[0]!r} is not a --section.key=value override")
        specs = row_specs(a.rows, extra, refs)
        a.profiled = set(row_specs(a.profile_rows, extra, refs)) if a.profile_rows else set()
        if a.profiled - set(specs):
            raise UserError(f"--profile-rows: {', '.join(sorted(a.profiled - set(specs)))} is not in --rows")
        sides = [s for s in a.sides.split(",") if s]
        if not sides or set(sides) - {"ours", "torchtitan"}:
            raise UserError(f"--sides={a.sides!r}: valid values are ours, torchtitan or ours,torchtitan")
        if a.steps < 1 or not 0 <= a.warmup < a.steps:
            raise UserError(
                f"--steps={a.steps} --warmup={a.warmup}: need 0 <= warmup < steps (a steady step)"
            )
        if not (Path(a.tokenizer) / "tokenizer.json").is_file():
            raise UserError(
                f"--tokenizer={a.tokenizer}: no tokenizer.json there (scripts/make_bench_tokenizer.py)"
            )
        out = Path(a.out).resolve()
        plans = {label: commands(label, row, args, a, out) for label, (row, args) in specs.items()}
        hardware = device_hardware(a.hardware)
        figures = {label: estimates(row, args, hardware) for label, (row, args) in specs.items()}
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        for r, (ours, peer, env) in plans.items():
            print(
                f"# {r}, ours\n{' '.join(ours)}\n# {r}, torchtitan\nNGPU={env['NGPU']} LOCAL_RANK=0"
                f" PYTHONPATH={env['PYTHONPATH']} {' '.join(peer)}"
            )
        print(f"\nour estimator, a rank priced on {hardware} (est.) and the published runs:\n")
        print(STEP_HEADER)
        for r, f in figures.items():
            print(*step_lines(r, f, ["estimate"]), sep="\n")
        print("\n| row | est. GiB on this device | fits |\n| --- | ---: | --- |")
        for r, f in figures.items():
            print(f"| {r} | {f['estimated_device_gib']:.1f} | {f['estimated_device_fits']} |")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_peer_tokenizer({"tokenizer": str(Path(a.tokenizer).resolve())}, out)

    def stop(signum, frame):
        raise Stopped

    signal.signal(signal.SIGTERM, stop)
    print("| row | world | published GiB | ours GiB | torchtitan GiB | ours/torchtitan | our estimator GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    results, stopped = {}, False
    for r, (ours, peer, env) in plans.items():
        row = specs[r][0]
        res = {"args": specs[r][1], "published_gib": row["memory_gib"], **figures[r]}
        results[r] = res
        try:
            if "ours" in sides:
                log = out / f"{r}-ours.log"
                code = run(ours, dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"), ROOT, log)
                try:
                    ours_figures(Path(ours[-1].split("=", 1)[1]), res, a, r, out)
                except (OSError, ValueError, KeyError) as e:
                    res["ours_error"] = f"exit {code}: {e} (see {log})"
            if "torchtitan" in sides:
                log = out / f"{r}-torchtitan.log"
                dump = Path(peer[-1].split("=", 1)[1])
                dump.mkdir(parents=True, exist_ok=True)
                code = run(peer, env, dump, log)
                secs, mem = peer_step_seconds(log, res["tokens_per_dp_rank_step"], res["non_dp_size"])
                if mem:
                    res["torchtitan_gib"] = max(mem)
                    res["torchtitan_step_s"], res["torchtitan_steps_used"] = steady(secs, a.warmup, a.steps)
                    res["torchtitan_step_times_s"] = [secs[s] for s in sorted(secs)]
                else:
                    oom = "out of memory" in log.read_text().lower()
                    res["torchtitan_error"] = f"exit {code}{', out of memory' if oom else ''} (see {log})"
        except Stopped:
            stopped = True
            res["stopped"] = "SIGTERM (time limit) during this row: its later figures are missing"

        def cell(k, res=res):
            v = res.get(k)
            return f"{v:.1f}" if isinstance(v, float) else (res.get(k.replace("_gib", "_error")) or "n/a")

        ratio = (
            res["ours_gib"] / res["torchtitan_gib"] if "ours_gib" in res and "torchtitan_gib" in res else None
        )
        print(
            f"| {r} | {row['num_devices']} | {res['published_gib']} | {cell('ours_gib')} | {cell('torchtitan_gib')} "
            f"| {f'{ratio:.3f}' if ratio else ''} | {cell('estimated_gib')} |",
            flush=True,
        )
        (out / "results.json").write_text(json.dumps(results, indent=2))
        if stopped:
            break
    print(
        f"\nstep time: median of steps {a.warmup + 1}-{a.steps} (simulated: one rank, no communication; est.:"
        f" priced on {hardware}, ours from its simulation.json)\n"
    )
    print(STEP_HEADER)
    for r, res in results.items():
        print(*step_lines(r, res, sides), sep="\n")
    for res in results.values():
        for t in res.get("ours_traces", []):
            print(f"trace: {t['file']} ({t['json_mib']:.1f} MiB of JSON, {t['gz_mib']:.1f} MiB gzipped)")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 124 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
