"""Preflight: bad launch configurations, each caught without a GPU or a process group, each with its message."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from conftest import ROOT, train_env
from torchtitan import preflight

BASE = ["--job.config_file=train_configs/debug_model.toml", "--training.seq_len=64"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = preflight.main([*BASE, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def dump(tmp_path):
    return f"--job.dump_folder={tmp_path / 'dump'}"


def test_good_launch_reports_every_check(capsys, dump, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run(
        capsys,
        "--world_size=4",
        "--nnodes=2",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        dump,
        "--checkpoint.enable=true",
    )
    assert code == 0, out + err
    for name in ("mesh", "nodes", "tokenizer", "dataset", "folders", "rendezvous"):
        assert f"preflight: {name:<10} ok" in out
    assert "world 4 = pp 1 x dp_replicate 1 x dp_shard 4" in out
    assert "2 node(s) x 2 process(es)" in out
    assert f"port {port} free" in out
    assert "preflight: memory     info  ~" in out
    assert out.strip().splitlines()[-1] == "preflight ok: llama3 debugmodel, world size 4"


def _tmp_file(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BAD = {
    # id: (arguments, message the report must contain)
    "world_not_divisible_by_tp": (
        ["--world_size=3", "--parallelism.tensor_parallel_degree=2"],
        "world size 3 is not divisible by dp_replicate 1 x cp 1 x tp 2 x pp 1 = 2",
    ),
    "degrees_do_not_multiply_to_world": (
        ["--world_size=4", "--parallelism.data_parallel_shard_degree=3"],
        "= 3, but the world size is 4",
    ),
    "expected_nodes_differs": (["--nnodes=2", "--world_size=2", "--job.expected_nodes=4"], "job.expected_nodes is 4 but the launch has 2 node(s)"),
    "world_not_divisible_by_nodes": (["--world_size=3", "--nnodes=2"], "world size 3 is not divisible by 2 nodes"),
    "tokenizer_missing": (["--model.tokenizer_path=/nonexistent/tok.model"], "/nonexistent/tok.model"),
    "vocab_mismatch": (["--model.vocab_size=4096"], "has 2048 tokens but the model's vocab_size is 4096"),
    "dataset_missing": (["--data.dataset_path=/nonexistent/data"], "data.dataset_path /nonexistent/data does not exist"),
    "dataset_unknown": (["--data.dataset=nosuch"], "data.dataset 'nosuch' is unknown"),
    "dataset_empty": (["--data.dataset_path={tmp}/empty.jsonl"], "empty.jsonl holds no records (empty file?)"),
    "dataset_wrong_field": (["--data.dataset_path={tmp}/other.jsonl"], "data.text_field 'text' is not a column"),
    "dump_not_writable": (["--job.dump_folder={tmp}/afile/sub"], "job.dump_folder {tmp}/afile/sub cannot be created: {tmp}/afile is a file, not a folder"),
    "checkpoint_not_writable": (
        ["--checkpoint.enable=true", "--checkpoint.folder={tmp}/afile/ckpt"],
        "checkpoint folder {tmp}/afile/ckpt cannot be created: {tmp}/afile is a file, not a folder",
    ),
    "head_does_not_resolve": (["--rdzv_endpoint=nosuchhost.invalid:29500"], "rendezvous host 'nosuchhost.invalid' does not resolve"),
    "endpoint_without_port": (["--rdzv_endpoint=localhost"], "rendezvous endpoint 'localhost' is not HOST:PORT"),
    "port_in_use": (["--rdzv_endpoint=127.0.0.1:{busy}"], "rendezvous port {busy} on 127.0.0.1 (127.0.0.1) is already in use"),
    "bad_world_size": (["--world_size=0"], "--world_size must be a positive integer, got '0'"),
    "unknown_config_key": (["--parallelism.tensor_paralel_degree=2"], "did you mean 'parallelism.tensor_parallel_degree'?"),
    "bad_timeout": (["--comm.watchdog_timeout_seconds=-1"], "'comm.watchdog_timeout_seconds' = -1 is invalid"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_launch_is_reported_with_exit_2(case, capsys, tmp_path, dump, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    _tmp_file(tmp_path, "empty.jsonl", "")
    _tmp_file(tmp_path, "other.jsonl", '{"content": "hello"}\n')
    _tmp_file(tmp_path, "afile", "not a folder")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    busy = listener.getsockname()[1]
    args, message = BAD[case]
    fill = {"tmp": str(tmp_path), "busy": busy}
    try:
        code, out, err = run(capsys, dump, *[a.format(**fill) for a in args])
    finally:
        listener.close()
    assert code == 2, out + err
    message = message.format(**fill)
    assert message in err.strip().splitlines()[-1], out + err  # the one closing line names the first failure
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in out + err


def test_several_failures_are_all_in_the_report(capsys, tmp_path):
    code, out, err = run(
        capsys,
        "--world_size=3",
        "--parallelism.tensor_parallel_degree=2",
        "--data.dataset_path=/nonexistent",
        "--rdzv_endpoint=nosuchhost.invalid:1",
        f"--job.dump_folder={tmp_path}",
    )
    assert code == 2
    assert out.count(" FAIL ") == 3 and "preflight: tokenizer  ok" in out
    assert err.strip().endswith("(and 2 more above)")


def test_master_addr_from_the_environment_is_checked(capsys, dump, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "nosuchhost.invalid")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    code, _, err = run(capsys, dump)
    assert code == 2 and "rendezvous host 'nosuchhost.invalid' does not resolve" in err


def test_memory_estimate_is_the_estimators(capsys, dump):
    from torchtitan.config import parse_args
    from torchtitan.estimate.training import estimate_memory
    from torchtitan.models import model_args_from_config

    cfg = parse_args([*BASE, dump])
    n = model_args_from_config(cfg.model, 64).num_params()
    for world in (1, 4):
        m = estimate_memory(cfg, world)
        assert f"~{m['memory_gib']:.2f} GiB per device" in preflight.estimate_memory(cfg, world)
        # the fp32 master weights are sharded over the world (1 rank: nothing sharded)
        assert abs(m["memory_breakdown_gib"]["parameters"] - 4 * n / world / 2**30) < 1e-3


def test_dry_run_from_the_trainer(tmp_path):
    r = subprocess.run(
        [sys.executable, "train.py", *BASE, "--job.dry_run=true", f"--job.dump_folder={tmp_path}", "--model.vocab_size=100"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2
    assert "preflight: tokenizer  FAIL" in r.stdout and "preflight: mesh       ok" in r.stdout
    assert not (tmp_path / "logs").exists()  # no training started: no rank logs
