"""The GPU-session scripts, checked on CPU: scripts/bench_torchtitan.py's argument checks and the command lines it
builds for both sides, scripts/gpu_check.sh's CPU mode, and the `cuda` marker that selects the CUDA-only tests."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, import_script, train_env

bench = import_script("bench_torchtitan")


@pytest.fixture(scope="module")
def tok128k(tmp_path_factory):
    """A tokenizer.json with Llama 3's 128,256 entries (a word-level vocabulary: only its size matters here)."""
    from tokenizers import Tokenizer, models

    folder = tmp_path_factory.mktemp("tok")
    vocab = {f"w{i}": i for i in range(128256)}
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(folder / "tokenizer.json"))
    return folder


def error_of(argv, capsys) -> str:
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def test_bad_arguments_are_one_line_exit_2(tok128k, tmp_path, capsys):
    t = f"--tokenizer={tok128k}"
    assert "unknown nope" in error_of([t, "--variants=eager,nope"], capsys)
    assert "8B-L1 .. 8B-L32" in error_of([t, "--shape=8B-L40"], capsys)
    assert "valid shapes" in error_of([t, "--shape=13B"], capsys)
    assert "--sides" in error_of([t, "--sides=hf"], capsys)
    assert "at least one full interval" in error_of([t, "--steps=15", "--warmup=10", "--interval=10"], capsys)
    assert "divisible by 16" in error_of([t, "--seq-len=8191"], capsys)
    assert "must be a step of the run (1..30) or 0" in error_of([t, "--memory-snapshot=31"], capsys)
    assert "--tokenizer is required" in error_of([], capsys)
    assert "does not exist" in error_of([f"--tokenizer={tmp_path}"], capsys)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    assert "2 entries, shape 8B-L16 needs 128,256" in error_of([f"--tokenizer={tmp_path}"], capsys)
    # and as a user runs it: one line on stderr, exit 2, no traceback, before any device is touched
    r = subprocess.run(
        [sys.executable, "scripts/bench_torchtitan.py", "--shape=8B-L0", t],
        cwd=ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: --shape=8B-L0: the 8B has 32 layers; use 8B-L1 .. 8B-L32"
    ]


def commands(shape: str, tok, tmp_path) -> dict:
    a = bench.parse([f"--tokenizer={tok}", f"--shape={shape}"])
    plan = bench.check(a)
    return plan, {
        v: {
            "ours": bench.ours_command(plan, a, v, tmp_path / "o"),
            "torchtitan": bench.peer_command(plan, a, v, tmp_path / "t"),
        }
        for v in plan["variants"]
    }


def test_both_sides_get_the_same_settings_for_every_variant(tok128k, tmp_path):
    plan, cmds = commands("8B-L16", tok128k, tmp_path)
    assert list(cmds) == ["eager", "compile", "compile-float8-tensorwise", "compile-float8-rowwise"]
    for v, sides in cmds.items():
        ours, peer = sides["ours"], " ".join(sides["torchtitan"])
        assert ours[1].endswith("train.py") and sides["torchtitan"][1].endswith("scripts/torchtitan_peer.py")
        for flag in ("--training.local_batch_size=1", "--training.seq_len=8192", "--training.steps=30"):
            assert flag in ours and flag in peer
        for flag in ("--model.flavor=8B", "--model.n_layers=16", "--activation_checkpoint.mode=selective"):
            assert flag in ours
        for flag in ("--activation_checkpoint.selective_ac_option=op", "--optimizer.implementation=fused"):
            assert flag in ours and flag in peer
        # the same optimizer and schedule: ours must not take debug_model.toml's lr 3e-3 / cosine while the peer
        # runs its 8e-4 / linear defaults (our 8B rowwise run diverged that way on an H100)
        for flag in (
            "--optimizer.lr=8e-4",
            "--optimizer.weight_decay=0.1",
            "--optimizer.eps=1e-8",
            "--training.max_norm=1.0",
            "--lr_scheduler.decay_type=linear",
            "--lr_scheduler.min_lr_factor=0.0",
        ):
            assert flag in ours and flag in peer
        assert "--model.flavor=bench_8B-L16" in peer and f"--model.hf_assets_path={tok128k}" in peer
        assert "--metrics.log_freq=10" in ours and "--metrics.log_freq=10" in peer
        compiled = v != "eager"
        assert ("--compile.enable=true" in ours) == compiled and ("--compile.enable" in peer) == compiled
        float8 = "float8" in v
        assert ("--float8.enable=true" in ours) == float8
        assert ("--model.converters=quantize.linear.float8" in peer) == float8
        assert ("--quantize.linear.float8.filter_fqns=output" in peer) == float8
        rowwise = v.endswith("rowwise")
        assert ("--float8.recipe=rowwise" in ours) == rowwise
        assert ("--quantize.linear.float8.recipe_name=rowwise" in peer) == rowwise
        assert ("--float8.recipe=tensorwise" in ours) == v.endswith("tensorwise")
    # the flavor the peer registers is the model ours builds: same fields, so the same parameters and FLOPs
    from torchtitan.models.llama3.args import ModelArgs, RopeScaling

    f = bench.peer_flavor(plan)["args"]
    rope = f.pop("rope_scaling_args")
    back = ModelArgs(
        **f,
        rope_scaling=RopeScaling(
            factor=rope["scaling_factor"],
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
            original_max_position_embeddings=rope["original_max_position_embeddings"],
        ),
    )
    assert back == plan["args"] and back.n_layers == 16 and back.dim == 4096

    # no memory snapshot unless asked for: history recording slows the steps
    assert not any("snapshot" in x for sides in cmds.values() for cmd in sides.values() for x in cmd)
    a = bench.parse([f"--tokenizer={tok128k}", "--memory-snapshot=5"])
    ours, peer = (
        bench.ours_command(plan, a, "compile", tmp_path),
        bench.peer_command(plan, a, "compile", tmp_path),
    )
    assert "--profiling.memory_snapshot_steps=5" in ours
    assert "--profiling.enable_memory_snapshot" in peer and "--profiling.profile_freq=5" in peer

    plan, cmds = commands("1B", tok128k, tmp_path)
    ours = cmds["compile"]["ours"]
    assert "--model.flavor=1B" in ours and "--model.tie_embeddings=false" in ours
    assert "--training.local_batch_size=2" in ours and not plan["args"].tie_embeddings
    assert bench.peer_flavor(plan)["args"]["dim"] == 2048


def test_each_run_compiles_with_its_own_cold_caches(tok128k, tmp_path, monkeypatch):
    """Inductor's and Triton's caches persist across processes: each run gets its own, so the side that runs second
    does not reuse the first one's kernels (its time to first step would look shorter)."""
    seen = {}

    def fake_run(cmd, env, cwd, log, step1):
        log.write_text("")
        seen[log.name] = env
        return 1, None

    monkeypatch.setattr(bench, "run_logged", fake_run)
    a = bench.parse([f"--tokenizer={tok128k}", "--shape=1B"])
    plan = bench.check(a)
    plan["peer_tokenizer"] = str(tok128k)
    for side in ("ours", "torchtitan"):
        assert "failed" in bench.one_run(plan, a, "compile", side, 1, tmp_path, cuda=True)
    dirs = {name: (env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) for name, env in seen.items()}
    assert dirs == {
        f"compile-{s}-1.log": (
            str(tmp_path / f"compile-{s}-1" / "inductor_cache"),
            str(tmp_path / f"compile-{s}-1" / "triton_cache"),
        )
        for s in ("ours", "torchtitan")
    }


def test_dry_run_prints_both_command_lines(tok128k, capsys):
    assert bench.main([f"--tokenizer={tok128k}", "--variants=compile", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# compile, ours" and out[2] == "# compile, torchtitan"
    peer = shlex.split(out[3])
    assert peer[0].startswith("BENCH_TT_FLAVOR=") and peer[1] == "PYTHONPATH=/tmp/torchtitan_peer"


def test_gpu_check_cpu_mode_lines_and_bad_arguments(tmp_path):
    def run(*args):
        return subprocess.run(
            ["bash", "scripts/gpu_check.sh", *args],
            cwd=ROOT,
            env=train_env(PY=sys.executable),  # the interpreter running the tests, as a user's PY=...
            capture_output=True,
            text=True,
        )

    r = run("--only", "nope")
    assert r.returncode == 2 and r.stderr.startswith(
        "error: --only: unknown check(s) nope (valid: tests-cuda,"
    )
    r = run("--cpu", f"--out={tmp_path}", "--only", "tests-cuda,tb-memory")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines[1].split()[:2] == ["SKIP", "tests-cuda"]
    assert lines[2].split()[:2] == ["PASS", "tb-memory"] and "memory/max_rss_gib" in lines[2]
    assert lines[-1] == "gpu_check summary: 1 passed, 0 failed, 1 skipped"
    assert (tmp_path / "tb-memory.log").stat().st_size > 0


def test_gpu_check_accepts_only_skips_for_more_gpus():
    gpu_check = import_script("gpu_check")
    lines = [
        "SKIPPED [1] tests/test_parity_cp.py:117: context parallel on CUDA needs 2 GPUs (one per NCCL rank)",
        "SKIPPED [1] tests/test_startup.py:69: needs a CUDA device",
        "7 passed, 2 skipped in 80.1s",
    ]
    assert gpu_check.unexpected_skips(lines) == [lines[1]]


def test_cuda_marker_selects_the_tests_skipped_without_cuda():
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "cuda", "--collect-only", "-q", "tests/test_metrics_units.py"],
        cwd=ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
    )
    ids = sorted(x for x in r.stdout.splitlines() if "::" in x)
    assert ids == [
        "tests/test_metrics_units.py::test_cuda_resolve_and_calibrate",
        "tests/test_metrics_units.py::test_memory_monitor_cuda",
    ]


def test_figures_are_read_from_both_sides_logs(tmp_path):
    """torchtitan 0.2.2's log row (its format string, colors off) and parameter line are parsed as the figures."""
    a = bench.parse(["--tokenizer=x", "--steps=30", "--interval=10", "--warmup=10"])
    log = tmp_path / "peer.log"
    log.write_text(
        "[rank0]: Model llama3 bench_8B-L16 size: 4,540,469,248 total parameters\n"
        "step:  1  loss: 12.01234  grad_norm:  9.1234  memory: 60.12GiB(63.17%)  tps: 2,001  tflops: 61.02  mfu: 6.17%\n"
        "step: 10  loss: 11.01234  grad_norm:  3.1234  memory: 70.50GiB(74.08%)  tps: 17,000  tflops: 520.00  mfu: 52.58%\n"
        "step: 20  loss: 10.01234  grad_norm:  2.1234  memory: 71.40GiB(75.02%)  tps: 17,831  tflops: 544.12  mfu: 55.02%\n"
        "\x1b[31mstep: 30  loss:  9.01234  grad_norm:  1.1234  memory: 71.40GiB(75.02%)  tps: 17,901  tflops: 546.00  mfu: 55.21%\x1b[39m\n"
    )
    tps, mem = bench.peer_rows(log, a)
    assert tps == [17831.0, 17901.0] and mem == 71.4  # rows after the 10 warm-up steps; the run's peak
    assert bench.param_count(log, "torchtitan") == 4_540_469_248
    assert bench.PEER_STEP1.search("step:  1  loss: 12.0") and not bench.PEER_STEP1.search(
        "step: 10  loss: 1"
    )


@pytest.mark.slow
def test_ours_runs_end_to_end_on_cpu_and_the_peer_says_why_not(tmp_path):
    """A real (tiny) invocation on CPU: our side's figures land in the table and results.json, torchtitan's row
    says it needs CUDA."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set((ROOT / "tests/assets/debug_corpus/train.jsonl").read_text().split()))[:2000]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *words])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    r = subprocess.run(
        [sys.executable, "scripts/bench_torchtitan.py", f"--tokenizer={tmp_path}", "--shape=debug", "--variants=eager",
         "--steps=4", "--interval=2", "--warmup=1", "--batch=2", "--seq-len=32", "--matmul-size=128",
         f"--out={tmp_path / 'out'}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    res = json.loads((tmp_path / "out" / "results.json").read_text())
    ours = res["variants"]["eager"]["ours"]
    assert ours["tokens_per_sec"] > 0 and ours["peak_memory_gib"] > 0 and ours["first_step_s"] > 0
    assert (
        ours["parameters"] > 0 and ours["mfu_matmul_pct"] > 0 and ours["mfu_table_pct"] is None
    )  # no CPU peak
    assert "needs CUDA" in res["variants"]["eager"]["torchtitan"]["error"]
    assert "| eager | ours |" in r.stdout


# ---- scripts/bench_sim_ranks.py: simulated full-size ranks, memory and step time ----------------------------------

sim = import_script("bench_sim_ranks")
NO_AC = "h100_8b_s4096_fsdp8_no_ac_eager_f8nc"


def test_sim_ranks_bad_arguments_are_one_line_exit_2(tok128k, capsys):
    def error(*argv) -> str:
        assert sim.main([f"--tokenizer={tok128k}", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ")
        return err[0]

    assert "unknown nope" in error("--rows=f8nc,nope")
    assert "must read --section.key=value, not fused" in error(f"--rows={NO_AC}+fused")
    assert "is not in --rows" in error("--rows=memory", f"--profile-rows={NO_AC}")
    assert "need 0 <= warmup < steps" in error("--steps=3", "--warmup=3")
    assert "'x' is not a --section.key=value override" in error("--extra-args=x")
    assert "no torchtitan equivalent known for --model.dim=64" in error("--extra-args=--model.dim=64")
    # the 405B memory row's float8 switches: torchtitan 0.2.2 has them under quantize.linear.float8 (flags)
    assert sim.peer_args(
        [
            "--float8.enable_fsdp_float8_all_gather=true",
            "--float8.precompute_float8_dynamic_scale_for_fsdp=true",
        ]
    ) == [
        "--quantize.linear.float8.enable_fsdp_float8_all_gather",
        "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
    ]
    # a variant turning a float8 row's float8 off takes the converter off the peer's line too
    assert sim.peer_args(["--float8.enable=true", "--compile.enable=true", "--float8.enable=false"]) == [
        "--compile.enable"
    ]
    assert sim.main([f"--tokenizer={tok128k}", "--dry-run"]) == 0  # the default (memory) rows build
    capsys.readouterr()


def test_sim_ranks_dry_run_rows_variants_profile_and_estimates(tok128k, capsys):
    argv = [f"--tokenizer={tok128k}", f"--rows=f8nc,{NO_AC}+--optimizer.implementation=fused", "--steps=5",
            f"--profile-rows={NO_AC}", "--hardware=h100-sxm", "--dry-run"]  # fmt: skip
    assert sim.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    cmds = {x[2:]: shlex.split(out[i + 1]) for i, x in enumerate(out) if x.startswith("# ")}
    fused = f"{NO_AC}+optimizer.implementation-fused"
    assert [k.rsplit(", ", 1)[0] for k in cmds][::2] == [*sim.ROW_SETS["f8nc"], fused]
    ours, peer = cmds[f"{NO_AC}, ours"], cmds[f"{NO_AC}, torchtitan"]
    # the profiled run: two more steps, the last recorded (profile_freq = steps), the dump folder last
    assert "--training.steps=7" in ours and "--profiling.profile_freq=7" in ours
    assert "--profiling.enable_profiling=true" in ours and ours[-1].startswith("--job.dump_folder=")
    assert peer[:3] == ["NGPU=8", "LOCAL_RANK=0", "PYTHONPATH=/tmp/torchtitan_peer"]  # its Trainer reads both
    assert "--training.steps=5" in peer and not any("profil" in x for x in peer)
    other = cmds["h100_8b_s4096_fsdp8_full_ac_eager_f8nc, ours"]
    assert "--training.steps=5" in other and not any("profil" in x for x in other)
    # a variant's override comes after the row's own on both sides (the last value wins)
    for side in ("ours", "torchtitan"):
        impl = [x for x in cmds[f"{fused}, {side}"] if x.startswith("--optimizer.implementation=")]
        assert impl == ["--optimizer.implementation=foreach", "--optimizer.implementation=fused"]
    # the estimator's table: published step = the row's tokens per GPU and step / its tokens/s
    rows = {
        x.split(" | ")[0][2:]: x.split(" | ")
        for x in out
        if x.startswith("| h100_") and " | estimate | " in x
    }
    assert list(rows) == [*sim.ROW_SETS["f8nc"], fused]
    assert float(rows[NO_AC][2]) == pytest.approx(4096 / 5339.0, abs=1e-3)
    assert float(rows[fused][7]) < float(rows[NO_AC][7])  # fused AdamW: fewer passes over the states
    for cells in rows.values():
        published, full, gap = float(cells[2]), float(cells[3]), float(cells[4])
        assert gap == pytest.approx(published - full, abs=2e-3)
        compute, opt, no_comm = float(cells[6]), float(cells[7]), float(cells[8])
        assert no_comm == pytest.approx(compute + opt, abs=2e-3) and 0 < no_comm < full
    fits = [x for x in out if x.startswith("| h100_") and x.endswith(" | True |")]
    assert len(fits) == 7  # every row fits an 80 GB H100 by the estimator's memory


def test_sim_ranks_reads_torchtitan_step_seconds(tmp_path):
    """torchtitan 0.2.2's log rows (its format, colors off): seconds per step = the rank's tokens / its tps."""
    log = tmp_path / "peer.log"
    log.write_text(
        "step:  1  loss: 12.01234  grad_norm:  9.1234  memory: 40.12GiB(42.17%)  tps: 301  tflops: 15.49  mfu: 1.57%\n"
        "step:  2  loss: 11.71234  grad_norm:  5.1234  memory: 49.50GiB(52.08%)  tps: 4,096  tflops: 210.8  mfu: 21.32%\n"
        "step:  3  loss: 11.01234  grad_norm:  3.1234  memory: 49.50GiB(52.08%)  tps: 5,120  tflops: 263.5  mfu: 26.65%\n"
        "\x1b[31mstep:  4  loss: 10.01234  grad_norm:  2.1234  memory: 49.60GiB(52.18%)  tps: 4,096  tflops: 210.8  mfu: 21.32%\x1b[39m\n"
    )
    secs, mem = sim.peer_step_seconds(log, 4096, 1)
    assert secs == pytest.approx({1: 4096 / 301, 2: 1.0, 3: 0.8, 4: 1.0}) and max(mem) == 49.6
    assert sim.steady(secs, 2, 4) == (pytest.approx(0.9), [3, 4])  # steps 1-2 are warm-up
    assert sim.peer_step_seconds(log, 4096, 8)[0][2] == pytest.approx(1 / 8)  # tps is per tp x pp x cp ranks


def test_sim_ranks_time_limit_still_reports(tok128k, tmp_path, monkeypatch, capsys):
    """SIGTERM (the command's `timeout`) during a run: the tables and results.json say what is done, exit 124."""

    def stopped(*a, **k):
        raise sim.Stopped

    monkeypatch.setattr(sim, "run", stopped)
    argv = [f"--tokenizer={tok128k}", f"--rows={NO_AC},h100_8b_s4096_fsdp8_full_ac_eager_f8nc", "--sides=ours",
            f"--out={tmp_path}", "--hardware=h100-sxm"]  # fmt: skip
    assert sim.main(argv) == 124
    import json

    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res) == [NO_AC] and "SIGTERM" in res[NO_AC]["stopped"]
    assert res[NO_AC]["published_step_s"] == pytest.approx(4096 / 5339.0)
    assert f"| {NO_AC} | ours |" in capsys.readouterr().out


@pytest.mark.slow
def test_sim_ranks_times_and_profiles_a_small_rank_on_cpu(tok128k, tmp_path):
    """A real (tiny) simulated rank through the step-time path: the debug model in the row's FSDP 8 layout, its
    steady steps, simulation.json's estimate, one profiled step whose trace comes back gzipped."""
    import gzip
    import json

    r = subprocess.run(
        [sys.executable, "scripts/bench_sim_ranks.py", f"--tokenizer={tok128k}", f"--rows={NO_AC}",
         "--extra-args=--model.flavor=debugmodel --training.seq_len=64", "--steps=3", "--warmup=1",
         f"--profile-rows={NO_AC}", "--sides=ours", f"--out={tmp_path}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())[NO_AC]
    assert (
        res["ours_steps_used"] == [2, 3] and len(res["ours_step_times_s"]) == 5
    )  # + profiler warm-up, recorded
    assert res["ours_step_s"] > 0 and res["ours_log_step_s"] > 0 and res["ours_gib"] > 0
    est = res["ours_estimated_step_s"]
    assert est["no_communication"] == pytest.approx(est["compute"] + est["optimizer"])
    (trace,) = res["ours_traces"]
    assert trace["file"].endswith(f"{NO_AC}-ours-step5.trace.json.gz") and trace["gz_mib"] < 16
    with gzip.open(trace["file"]) as f:
        assert json.load(f)["traceEvents"]
    line = next(x for x in r.stdout.splitlines() if x.startswith(f"| {NO_AC} | ours |"))
    assert line.split(" | ")[5] == f"{res['ours_step_s']:.3f} (2-3)"
    line = next(x for x in r.stdout.splitlines() if x.startswith(f"| {NO_AC} | ours, log to log |"))
    assert line.split(" | ")[5] == f"{res['ours_log_step_s']:.3f} (2-3)"


gs = import_script("bench_gemm_beside_sms")


def test_gemm_beside_sms_lists_the_planned_block_gemms(capsys):
    assert gs.main(["--dry-run", "--sets=8b,405b-tp8"]) == 0
    out = capsys.readouterr().out
    assert "8b: 21 GEMMs: wq.fwd 8192x4096x4096, wk.fwd 8192x1024x4096" in out
    assert "w2.fwd 8192x4096x14336" in out and "w1.wgrad 14336x4096x8192" in out
    # TP 8 splits the output features of wq/wk/wv/w1/w3 and the input features of wo/w2
    assert "405b-tp8: 21 GEMMs: wq.fwd 16384x2048x16384, wk.fwd 16384x128x16384" in out
    assert "wo.fwd 16384x16384x2048" in out and "w2.fwd 16384x16384x6656" in out


def test_gemm_beside_sms_rules():
    ms = 1e-3
    # static persistent: the displaced CTAs wait min(R, W); any k >= 1 does it
    assert gs.predict("static", [ms], 0.5 * ms, 132, 2, [True]) == pytest.approx(1.5 * ms)
    assert gs.predict("static", [ms], 4 * ms, 132, 16, [True]) == pytest.approx(2 * ms)
    assert gs.predict("static", [ms, ms, ms], 1.5 * ms, 132, 2, [True] * 3) == pytest.approx(4 * ms)
    # share: only the part under the holder runs on the SMs left; a kernel that is not persistent takes this rule
    assert gs.predict("share", [ms], 4 * ms, 132, 16, [True]) == pytest.approx(ms * 132 / 116)
    assert gs.predict("static", [ms], 0.5 * ms, 132, 16, [False]) == pytest.approx(
        0.5 * ms + ms - 0.5 * ms * 116 / 132
    )
    assert gs.predict("static", [ms], 4 * ms, 132, 0, [True]) == pytest.approx(ms)


def test_gemm_beside_sms_bad_arguments_are_one_line_exit_2(capsys):
    for bad in (["--sets=8b,9b"], ["--dtypes=fp4"], ["--holders=a"], ["--hold-ms=0"]):
        with pytest.raises(SystemExit) as e:
            gs.main(bad)
        assert e.value.code == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error:" in err, err


bw = import_script("bench_bandwidth_beside_ring")


def test_bandwidth_beside_ring_lists_the_block_kernels_at_the_planned_shapes(capsys):
    assert bw.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8B at 1 x 4096: dim 4096, FFN 14336, q 4096, k/v 1024" in out
    # the SwiGLU product reads two 4096 x 14336 bf16 tensors and writes one
    assert f"swiglu product (mul): memory, {3 * 4096 * 14336 * 2 / 1e6:.1f} MB moved" in out
    assert f"rope upcast (q to fp32): memory, {4096 * 4096 * 6 / 1e6:.1f} MB moved" in out
    assert "w1 forward (GEMM): gemm" in out


def test_bandwidth_beside_ring_rule_is_the_estimators():
    """Memory-bound targets: 1 / (1 - c), c the copy's share of the bandwidth (what fsdp_units prices beside a ring,
    c = 3 x busbw / HBM bandwidth); the GEMM: the SMs' share beside the CTA copy, nothing beside the copy engine."""
    from torchtitan.estimate import collectives

    assert bw.rule("memory", "engine", 0.36, 132, 16) == pytest.approx(1 / 0.64)
    assert bw.rule("memory", "ctas", 0.25, 132, 16) == pytest.approx(4 / 3)
    assert bw.rule("gemm", "ctas", 0.25, 132, 16) == pytest.approx(132 / 116)
    assert bw.rule("gemm", "engine", 0.36, 132, 16) == 1.0
    assert collectives.RING_HBM_BYTES_PER_BUS_BYTE == 3.0


def test_bandwidth_beside_ring_refuses_bad_arguments_and_a_machine_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as e:
        bw.main(["--ctas=0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ctas" in err
    import torch

    if not torch.cuda.is_available():
        assert bw.main([]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err


def test_bandwidth_beside_ring_checks_the_upcast_rule_on_the_part():
    """The bench prints the upcast's rate alone beside rates.eager_upcast_gbps for the part it runs on (an H100
    SXM: 132 SMs at 1,980 MHz x 7.03 bytes), and the downcast's beside the elementwise rate."""
    rule = bw.upcast_rule("NVIDIA H100 80GB HBM3")
    assert rule["part"] == "H100 SXM" and rule["boost_mhz"] == 1980.0
    assert rule["upcast_gbps"] == pytest.approx(7.034 * 132 * 1980 / 1e3, rel=1e-3)
    assert bw.upcast_rule("a part nobody knows") == {}
    targets = [{"target": "rope upcast (q to fp32)", "alone_gbps": 1800.0},
               {"target": "rope downcast (q to bf16)", "alone_gbps": 2700.0}]  # fmt: skip
    line = bw.upcast_line({"upcast_rule": rule, "targets": targets, "sms": 132})
    assert line.startswith("upcast alone 1800 GB/s, 6.89 bytes per SM and clock at the boost clock;")
    assert "the estimator's H100 SXM: 1838 GB/s (0.98x)" in line and "(1.01x)" in line
    assert bw.upcast_line({"upcast_rule": {}, "targets": targets, "sms": 132}) is None


hf = import_script("bench_hf_llama")


def test_hf_llama_bad_arguments_are_one_line_exit_2(capsys):
    for argv, want in (
        (["--backends=cudnn,foo"], "--backends: foo; valid: cudnn, flash, math"),
        (["--configs=6-2048"], "'6-2048' is not BATCHxSEQ"),
        (["--configs=0x2048"], "needs a batch >= 1"),
        (["--configs=6x2048", "--profile=1x16384"], "--profile 1x16384: not in --configs"),
        (["--iters=0"], "need warmup >= 0 and iters >= 1"),
    ):
        assert hf.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and want in err[0], (argv, err)
    r = subprocess.run(  # as a user runs it on a machine without CUDA: one line, exit 2, nothing on stdout
        [sys.executable, "scripts/bench_hf_llama.py"],
        cwd=ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("error: --device cuda: no CUDA device here")


def test_hf_llama_flags_and_figures_are_the_reference_rows():
    """Each published row of the source: its seconds are batch x seq over the row's tokens/s, and the script's
    estimator flags are the row's own (its hardware and clock aside, which the script takes from the device)."""
    from torchtitan.estimate.validation import load_reference

    published = hf.published_s()
    rows = [r for r in load_reference()["training"] if r["source"] == hf.SOURCE]
    assert len(rows) == 24 and {k: len(v) for k, v in published.items()} == {"H200": 12, "B200": 12}
    # the CSV's full digits (artifacts/h200_training_timing.csv: CUDNN_ATTENTION,1,16384,0.4235471987724304)
    assert published["H200"][("cudnn", 1, 16384)] == pytest.approx(0.4235471987724304, rel=1e-6)
    for row in rows:
        part, b, s, backend = re.match(r"^(h200|b200)_.*_b(\d+)_s(\d+)_(cudnn|flash)_", row["id"]).groups()
        b, s = int(b), int(s)
        keep = [f for f in row["args"] + row["estimate_args"]
                if not f.startswith(("--estimate.hardware=", "--estimate.sm_clock_mhz="))]  # fmt: skip
        assert set(hf.estimate_flags(b, s, backend)) == {*keep, "--estimate.num_devices=1",
                                                          "--estimate.accuracy=false"}, row["id"]  # fmt: skip
        assert published[part.upper()][(backend, b, s)] == pytest.approx(b * s / row["tokens_per_sec"])


def test_hf_llama_runs_times_and_profiles_on_cpu(tmp_path, capsys):
    argv = ["--model=tiny", "--device=cpu", "--backends=math", "--configs=2x64,1x128", "--profile=1x128",
            "--warmup=1", "--iters=2", f"--out={tmp_path}"]  # fmt: skip
    assert hf.main(argv) == 0
    out = capsys.readouterr().out
    assert "1x128 math, one profiled iteration against the estimate:" in out
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["model"] == "tiny" and [(r["batch"], r["seq"]) for r in doc["runs"]] == [(2, 64), (1, 128)]
    assert all(r["s_per_iter"] > 0 and r["tokens_per_s"] == pytest.approx(r["batch"] * r["seq"] / r["s_per_iter"])
               for r in doc["runs"])  # fmt: skip
    profiled = doc["runs"][1]
    assert "trace" not in doc["runs"][0] and (tmp_path / profiled["trace"]).exists()
    terms = profiled["measured_terms"]
    assert terms["device"] == "cpu" and terms["terms"]["matmul"] > 0 and terms["terms"]["attention"] > 0
