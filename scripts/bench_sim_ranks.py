#!/usr/bin/env python
"""One simulated rank of a full-size layout on this device, ours and PyPI torchtitan's, with the published peak.

    python scripts/make_bench_tokenizer.py --out /tmp/tok
    python scripts/bench_sim_ranks.py --tokenizer /tmp/tok                        # the three rows below
    python scripts/bench_sim_ranks.py --tokenizer /tmp/tok --rows h100_8b_fsdp8_eager --dry-run

Rows are torchtitan's published H100 runs as tests/estimate_reference.toml records them (its `args`, in our keys,
and `memory_gib`): h100_8b_fsdp8_eager (8B FSDP 8, 2 x 8192, selective AC: 82.4 GiB), h100_70b_fsdp32_tp8 (70B
FSDP 32 x TP 8, 16 x 8192, full AC, compile, float8: 71.9 GiB), h100_405b_fsdp8_tp8_pp8_1f1b (405B FSDP 8 x TP 8
x PP 8: 82.5 GiB; 96 GB parts, so it may not fit an 80 GB H100). Each side runs rank 0 of the row's world in one
process with fake process groups (ours: --comm.mode=fake_backend --comm.fake_world_size=N, docs/launching.md;
torchtitan: NGPU=N --comm.mode=fake_backend, its own), --steps steps; reported: each side's max reserved memory
(its own log), ours/torchtitan, the published figure and our estimator's (simulation.json's estimated_gib).
torchtitan's keys are translated from ours (same names for batch, sequence, parallel degrees, AC, compile;
--float8.enable=true -> its float8 converter with the output head kept in bf16, as ours).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_torchtitan import ANSI, PEER_ROW, write_peer_tokenizer  # noqa: E402

from torchtitan.errors import UserError  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROWS = ["h100_8b_fsdp8_eager", "h100_70b_fsdp32_tp8", "h100_405b_fsdp8_tp8_pp8_1f1b"]
SAME = (
    "--model.flavor",
    "--training.seq_len",
    "--training.local_batch_size",
    "--parallelism.",
    "--activation_checkpoint.",
    "--optimizer.implementation",  # the same key and values (for-loop/foreach/fused) in torchtitan 0.2.2
)


def reference_rows() -> dict:
    data = tomllib.loads((ROOT / "tests" / "estimate_reference.toml").read_text())
    return {r["id"]: r for r in data["training"]}


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
            out += [
                "--model.converters=quantize.linear.float8",
                "--quantize.linear.float8.filter_fqns=output",
            ]
        else:
            raise UserError(f"no torchtitan equivalent known for {arg}")
    return out


def commands(row: dict, a, out: Path) -> tuple[list[str], list[str], dict]:
    n = row["num_devices"]
    dump = out / row["id"]
    ours = [
        sys.executable,
        str(ROOT / "train.py"),
        f"--job.config_file={ROOT / 'train_configs' / 'debug_model.toml'}",
        *row["args"],
        f"--model.tokenizer_path={Path(a.tokenizer).resolve()}/tokenizer.json",
        "--comm.mode=fake_backend",
        f"--comm.fake_world_size={n}",
        "--comm.fake_rank=0",
        f"--training.steps={a.steps}",
        "--metrics.log_freq=1",
        "--metrics.enable_tensorboard=false",
        "--job.print_config=false",
        f"--job.dump_folder={dump}-ours",
    ]
    peer = [
        sys.executable,
        str(ROOT / "scripts" / "torchtitan_peer.py"),
        *peer_args(row["args"]),
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
        NGPU=str(n),
        PYTHONPATH=str(Path(a.peer_path).resolve()),
        PYTHONUNBUFFERED="1",
        HF_DATASETS_OFFLINE="1",
    )
    return ours, peer, env


def run(cmd, env, cwd, log: Path) -> int:
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--tokenizer", required=True, help="folder with a 128,256-entry tokenizer.json")
    p.add_argument(
        "--rows", default=",".join(ROWS), help="tests/estimate_reference.toml ids, comma-separated"
    )
    p.add_argument("--sides", default="ours,torchtitan")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peer-path", default="/tmp/torchtitan_peer")
    p.add_argument("--out", default="outputs/bench_sim_ranks")
    p.add_argument("--dry-run", action="store_true", help="print both command lines and exit")
    a = p.parse_args(argv)
    refs = reference_rows()
    try:
        names = [r for r in a.rows.split(",") if r]
        bad = [r for r in names if r not in refs]
        if bad or not names:
            raise UserError(
                f"--rows: unknown {', '.join(bad) or '(empty)'}; valid: tests/estimate_reference.toml ids"
            )
        sides = [s for s in a.sides.split(",") if s]
        if not sides or set(sides) - {"ours", "torchtitan"}:
            raise UserError(f"--sides={a.sides!r}: valid values are ours, torchtitan or ours,torchtitan")
        if not (Path(a.tokenizer) / "tokenizer.json").is_file():
            raise UserError(
                f"--tokenizer={a.tokenizer}: no tokenizer.json there (scripts/make_bench_tokenizer.py)"
            )
        out = Path(a.out).resolve()
        plans = {r: commands(refs[r], a, out) for r in names}
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        for r, (ours, peer, env) in plans.items():
            print(
                f"# {r}, ours\n{' '.join(ours)}\n# {r}, torchtitan\nNGPU={env['NGPU']} PYTHONPATH={env['PYTHONPATH']} {' '.join(peer)}"
            )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_peer_tokenizer({"tokenizer": str(Path(a.tokenizer).resolve())}, out)
    print("| row | world | published GiB | ours GiB | torchtitan GiB | ours/torchtitan | our estimator GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    results = {}
    for r, (ours, peer, env) in plans.items():
        res = {"published_gib": refs[r]["memory_gib"]}
        if "ours" in sides:
            log = out / f"{r}-ours.log"
            code = run(ours, dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"), ROOT, log)
            dump = Path(ours[-1].split("=", 1)[1])
            try:
                rows = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
                res["ours_gib"] = max(x.get("memory/max_reserved_gib", 0.0) for x in rows)
                sim = json.loads((dump / "simulation.json").read_text())
                res["estimated_gib"] = sim.get("estimated_gib", {}).get("peak")
            except (OSError, ValueError) as e:
                res["ours_error"] = f"exit {code}: {e} (see {log})"
        if "torchtitan" in sides:
            log = out / f"{r}-torchtitan.log"
            dump = Path(peer[-1].split("=", 1)[1])
            dump.mkdir(parents=True, exist_ok=True)
            code = run(peer, env, dump, log)
            mem = [
                float(m.group(3))
                for m in (PEER_ROW.search(ANSI.sub("", x)) for x in log.read_text().splitlines())
                if m
            ]
            if mem:
                res["torchtitan_gib"] = max(mem)
            else:
                oom = "out of memory" in log.read_text().lower()
                res["torchtitan_error"] = f"exit {code}{', out of memory' if oom else ''} (see {log})"
        results[r] = res

        def cell(k, res=res):
            v = res.get(k)
            return f"{v:.1f}" if isinstance(v, float) else (res.get(k.replace("_gib", "_error")) or "n/a")

        ratio = (
            res["ours_gib"] / res["torchtitan_gib"] if "ours_gib" in res and "torchtitan_gib" in res else None
        )
        print(
            f"| {r} | {refs[r]['num_devices']} | {res['published_gib']} | {cell('ours_gib')} | {cell('torchtitan_gib')} "
            f"| {f'{ratio:.3f}' if ratio else ''} | {cell('estimated_gib')} |",
            flush=True,
        )
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
