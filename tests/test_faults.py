"""Fault injection: nothing lost, nothing silent.

Every fault below ends in one line on stderr naming the file (exit code 2; 75 for a preemption), keeps every
committed checkpoint, and where a restart applies, continues with the losses of an uninterrupted run (bitwise,
fp32 on CPU): flipped bytes in a checkpoint, a full disk (a real 100 MiB tmpfs where this machine can mount one),
an I/O error on one of two ranks, a read-only checkpoint folder (a real read-only bind mount where possible),
SIGTERM during an async save, kill -9 of one rank in the middle of writing its checkpoint file, a tokenizer
replaced between save and resume, another model's checkpoint, unreadable or corrupt data, unwritable outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import CKPT_ARGS, CKPT_ARGS2, ROOT, TINY, losses, run_train, steps_in, train_env
from torchtitan.checkpoint import MARKER, verify_checkpoint
from torchtitan.errors import UserError

ARGS, ARGS2 = CKPT_ARGS, CKPT_ARGS2


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


def error_line(r) -> str:
    """The run's last stderr line, which must be its only error line (no traceback)."""
    lines = r.stderr.strip().splitlines()
    assert not any("Traceback" in line for line in lines), r.stderr[-3000:]
    return lines[-1] if lines else ""


def popen_train(args, env, stderr=subprocess.PIPE) -> subprocess.Popen:
    """`python train.py` whose stdout (the rank-0 log) the test reads line by line while it runs."""
    cmd = [sys.executable, "train.py", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)


def torchrun(nproc: int, args, torchrun_args=(), env=None, timeout=600):
    from torchtitan.launch import local_command

    cmd = [*local_command(nproc, "train.py", tuple(torchrun_args)), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env or train_env(), capture_output=True, text=True, timeout=timeout
    )


# ------------------------------------------------------------------------------------------------ mounts


def _mount(*args) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A real small file system at `path`, or None where this machine cannot mount one (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)):
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def bind(path):
    """`path` bind-mounted onto itself, so that it can be remounted read-only (None where impossible)."""
    if not _mount("--bind", str(path), str(path)):
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path, mode: str) -> None:
    assert _mount("-o", f"remount,bind,{mode}", str(path)), f"cannot remount {path} {mode}"


# ------------------------------------------------------------------------------------------------ integrity


def test_checksums_are_computed_while_writing_and_equal_the_files(straight1):
    """The marker's checksums (hashed as the bytes were written, carried to rank 0 by DCP's gather) equal a
    fresh read of each file, and every file of the checkpoint is listed."""
    from torchtitan.checkpoint.checksums import file_checksum

    for step in (3, 6):
        path = straight1 / "checkpoint" / f"step-{step}"
        marker = json.loads((path / MARKER).read_text())
        assert marker["checksum"] == "xxh3_64"
        assert marker["model"]["flavor"] == "debugmodel" and marker["model"]["args"]["dim"] == 256
        assert marker["tokenizer"]["vocab_size"] == 2048
        files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != MARKER}
        assert set(marker["files"]) == files
        for rel, entry in marker["files"].items():
            assert entry["checksum"] == file_checksum(path / rel, "xxh3_64"), rel
        verify_checkpoint(str(path), checksums=True)


def test_flipped_bytes_stop_the_resume_then_an_older_step_resumes_exactly(straight1, tmp_path):
    ck = tmp_path / "checkpoint"
    shutil.copytree(straight1 / "checkpoint", ck)
    data = ck / "step-6" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # two flipped bits inside tensor data, same size: sizes alone cannot tell
    raw[len(raw) // 3] ^= 0x01
    data.write_bytes(bytes(raw))
    before = {p: p.stat().st_mtime_ns for p in ck.rglob("*")}
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}"])
    assert r.returncode == 2
    line = error_line(r)
    assert line.startswith(f"error: checkpoint file {data} of step 6 is corrupt: xxh3_64 checksum "), line
    assert ", expected " in line and "--checkpoint.load_step=3" in line
    assert {p: p.stat().st_mtime_ns for p in ck.rglob("*")} == before  # nothing written, nothing deleted
    assert not (tmp_path / "metrics.jsonl").exists()
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}", "--checkpoint.load_step=3"])
    assert r.returncode == 0 and "resumed from" in r.stdout
    assert losses(tmp_path) == {s: v for s, v in losses(straight1).items() if s > 3}
    verify_checkpoint(str(ck / "step-6"), checksums=True)  # step 6 written again, sound


# ------------------------------------------------------------------------------------------------ full disk, I/O errors


@pytest.mark.parametrize("mode", ["disabled", "async"])
def test_full_disk_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path, mode):
    """A 100 MiB tmpfs holds one debug-model checkpoint (64 MiB) but not two; without mount rights the
    ENOSPC is injected at the writer instead."""
    with tmpfs(tmp_path / "disk", "100m") as disk:
        dump = disk or tmp_path / "disk"
        env = train_env() if disk else train_env(TORCHTITAN_TEST_IO_ERROR="ENOSPC:2")
        args = ARGS + [
            f"--job.dump_folder={dump}",
            "--checkpoint.interval=1",
            f"--checkpoint.async_mode={mode}",
        ]
        r = run_train(1, args, env=env)
        assert r.returncode == 2
        line = error_line(r)
        ck = dump / "checkpoint"
        assert line.startswith("error: checkpoint step-2 could not be saved: No space left on device ("), line
        assert (
            f"free at {ck}; last good checkpoint: {ck / 'step-1'} (step 1); partial folder removed;" in line
        )
        assert line.endswith(
            f"free space at {ck} (or lower checkpoint.keep_latest_k), then rerun to resume from step 1"
        )
        assert listing(ck) == ["step-1"]
        verify_checkpoint(str(ck / "step-1"), checksums=True)
        if disk:  # the trainer warned at its start: 100 MiB < 6 saves x 64 MiB
            assert f"checkpoint folder {ck} has 100.0 MiB free, less than the ~" in r.stdout


def test_io_error_on_one_rank_of_two_stops_both_with_the_same_line(tmp_path):
    """Async saves, 2 ranks: rank 1's write of step 6 fails with EIO. Both ranks learn it through the per-step
    flags and DCP's gathered failure, and both stop with rank 0's account; step 3 stays the last checkpoint."""
    args = ARGS2 + [f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async", "--training.steps=8"]
    r = torchrun(2, args, env=train_env(TORCHTITAN_TEST_IO_ERROR="EIO:6:1"))
    assert r.returncode != 0 and "failed (exitcode: 2)" in r.stderr, r.stderr[-3000:]
    ranks = r.stderr.split("failed (exitcode: 2)")[0]  # what the ranks wrote, before torchrun's own report
    errors = [line for line in ranks.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and errors[0] == errors[1] and "Traceback" not in ranks, ranks
    assert errors[0].startswith("error: checkpoint step-6 could not be saved: Input/output error (")
    assert "__1_0.distcp" in errors[0] and "check the storage of" in errors[0]
    assert listing(tmp_path / "checkpoint") == ["step-3"]


def test_read_only_checkpoint_folder(straight1, tmp_path):
    """Read-only before the start: one line before any process group. Made read-only while training (at a
    stall in step 5): the save of step 6 fails with EROFS, one line, step 3 intact. Without mount rights the
    second part injects EROFS at the writer and the first is skipped."""
    ck = tmp_path / "checkpoint"
    shutil.copytree(straight1 / "checkpoint" / "step-3", ck / "step-3")
    args = ARGS + [f"--job.dump_folder={tmp_path}"]
    with bind(ck) as mounted:
        if mounted:
            remount(ck, "ro")
            r = run_train(1, args)
            assert r.returncode == 2
            assert error_line(r).startswith(
                f"error: checkpoint folder {ck} is not writable: Read-only file system"
            )
            assert "parallelism:" not in r.stdout  # stopped before the process group and the model
            remount(ck, "rw")
            env = train_env(TORCHTITAN_TEST_STALL_AT_STEP="5", TORCHTITAN_TEST_STALL_SECONDS="6")
            p = popen_train(args, env)
            for line in p.stdout:
                if "stalls in step 5" in line:
                    remount(ck, "ro")
                    break
            out, err = p.communicate(timeout=300)
            code = p.returncode
        else:
            r = run_train(1, args, env=train_env(TORCHTITAN_TEST_IO_ERROR="EROFS:6"))
            code, err = r.returncode, r.stderr
        assert code == 2, err[-3000:]
        line = err.strip().splitlines()[-1]
        assert line.startswith("error: checkpoint step-6 could not be saved: Read-only file system ("), line
        assert f"last good checkpoint: {ck / 'step-3'} (step 3)" in line and f"make {ck} writable" in line
    assert listing(ck) == ["step-3"]
    verify_checkpoint(str(ck / "step-3"), checksums=True)


# ------------------------------------------------------------------------------------------------ signals, kills


def test_sigterm_during_async_save_commits_both_and_resumes_exactly(straight1, tmp_path):
    """Each checkpoint file waits 2 s before its first byte (slow storage), so SIGTERM, sent when the async
    save of step 3 has started, arrives while it is being written. The run finishes the step, waits for that
    save, saves step 4, exits 75; the restart continues with the uninterrupted run's losses."""
    args = ARGS + [f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async"]
    env = train_env(TORCHTITAN_TEST_SAVE_SECONDS="2")
    p = popen_train(args, env, stderr=subprocess.STDOUT)
    for line in p.stdout:
        if "checkpoint step-3: async save started" in line:
            p.send_signal(signal.SIGTERM)
            break
    rest = p.stdout.read()
    assert p.wait(timeout=300) == 75, rest
    assert rest.index("signal 15 received") > rest.index("checkpoint step-3 saved")  # waited, then committed
    assert steps_in(tmp_path) == [3, 4]
    assert not [n for n in listing(tmp_path / "checkpoint") if ".tmp-" in n]
    r = run_train(1, args)
    assert r.returncode == 0 and "resumed from" in r.stdout and "step 4" in r.stdout
    assert losses(tmp_path) == losses(straight1)


def test_kill9_of_one_rank_while_writing_then_restart_is_bitwise_identical(straight2, tmp_path):
    """2 ranks, async saves: rank 1 is SIGKILLed at the first byte of its step-6 data file (in the writing
    thread). torchrun --max-restarts=1 restarts both, they resume from step 3 (the last committed) and end with
    the uninterrupted run's losses; the half-written step 6 was never read and is cleaned up."""
    args = ARGS2 + [f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async"]
    r = torchrun(2, args, ["--max-restarts=1"], env=train_env(TORCHTITAN_TEST_FAULT="save_data:6:1"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "resumed from" in out and "step 3" in out
    assert losses(tmp_path) == losses(straight2)
    assert steps_in(tmp_path) == [3, 6]
    assert not [n for n in listing(tmp_path / "checkpoint") if ".tmp-" in n]


# ------------------------------------------------------------------------------------------------ changed inputs


def _tokenizer_json(path, vocab_size: int, reverse: bool = False) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    corpus = (ROOT / "tests/assets/debug_corpus/train.jsonl").read_text().split()
    words = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    for w in corpus:
        if w not in words and len(words) < vocab_size:
            words.append(w)
    if reverse:  # same words, other ids
        words = words[:3] + words[3:][::-1]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.save(str(path))


def test_tokenizer_replaced_between_save_and_resume(tmp_path):
    tok = tmp_path / "tokenizer.json"
    _tokenizer_json(tok, 512)
    base = TINY + ["--metrics.peak_tflops=1", "--checkpoint.enable=true", "--checkpoint.interval=2"]
    base += [f"--model.tokenizer_path={tok}", f"--job.dump_folder={tmp_path / 'run'}"]
    r = run_train(1, base + ["--training.steps=2", "--model.vocab_size=512"])
    assert r.returncode == 0
    _tokenizer_json(tok, 256)  # replaced by a smaller vocabulary
    r = run_train(1, base + ["--training.steps=4", "--model.vocab_size=512"])
    assert r.returncode == 2
    assert error_line(r) == (
        f"error: tokenizer {tok} has 256 tokens but the model's vocab_size is 512; set --model.vocab_size=256"
        " or use a tokenizer with 512 tokens"
    )
    r = run_train(1, base + ["--training.steps=4", "--model.vocab_size=256"])  # following that advice
    assert r.returncode == 2
    assert error_line(r) == (
        f"error: tokenizer changed since checkpoint {tmp_path / 'run' / 'checkpoint' / 'step-2'} was written: it"
        f" was trained with {tok} (512 tokens), this run uses {tok} (256 tokens); restore the original tokenizer"
        " file, or start a new run in another job.dump_folder"
    )
    assert steps_in(tmp_path / "run") == [2]
    _tokenizer_json(tok, 512, reverse=True)  # same size, other ids: resumes, with a warning
    r = run_train(1, base + ["--training.steps=3", "--model.vocab_size=512"])
    assert r.returncode == 0 and "other content): token ids may now stand for other text" in r.stdout


def test_checkpoint_of_another_model_is_one_line_naming_the_parameter(tmp_path):
    """A converted checkpoint of a narrower model (dim 128, 2 layers) given as initial_load_path to a
    debugmodel run: stopped before DCP's planner with both shapes and the checkpoint's recorded model."""
    from torchtitan.checkpoint.hf import hf_config_from_model_args, hf_to_dcp, ours_to_hf, write_hf_checkpoint
    from torchtitan.models.llama3 import ModelArgs, Transformer

    args = ModelArgs(dim=128, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=2048, max_seq_len=64)
    model = Transformer(args)
    model.init_weights(seed=0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    write_hf_checkpoint(tmp_path / "hf", hf_config_from_model_args(args), ours_to_hf(sd, args))
    hf_to_dcp(tmp_path / "hf", tmp_path / "dcp")
    r = run_train(
        1,
        TINY
        + [
            "--training.steps=1",
            "--metrics.peak_tflops=1",
            f"--job.dump_folder={tmp_path / 'run'}",
            f"--checkpoint.initial_load_path={tmp_path / 'dcp'}",
        ],
    )
    assert r.returncode == 2
    assert error_line(r) == (
        f"error: checkpoint {tmp_path / 'dcp'} belongs to another model: parameter tok_embeddings.weight is"
        " [2048, 128] there and [2048, 256] in this run's model (llama3 debugmodel, dim 256, 6 layers, 16 heads,"
        " 4 kv heads, vocab 2048); the checkpoint's model: llama3 (dim 128, 2 layers, 8 heads, 4 kv heads, vocab"
        " 2048); no flavor has its shape (dim 128 vs 256, n_layers 2 vs 6, n_heads 8 vs 16, ffn_hidden_dim 512 vs"
        " 768: checkpoint vs this run); point checkpoint.initial_load_path at a checkpoint of this model"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_rerun_with_another_flavor_stops_before_building_the_model(straight1, tmp_path):
    """The issue's case: the same dump folder rerun with --model.flavor changed. The check reads only the marker
    and DCP's .metadata, before the 1B model is built or the process group's model work starts."""
    ck = tmp_path / "checkpoint"
    shutil.copytree(straight1 / "checkpoint" / "step-3", ck / "step-3")
    shutil.copy(straight1 / "config.toml", tmp_path / "config.toml")
    recorded = (tmp_path / "config.toml").read_text()
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}", "--model.flavor=1B", "--model.vocab_size=2048"])
    assert r.returncode == 2
    assert (tmp_path / "config.toml").read_text() == recorded  # the run that stopped overwrote nothing
    assert error_line(r) == (
        f"error: checkpoint {ck / 'step-3'} belongs to another model: parameter tok_embeddings.weight is"
        " [2048, 256] there and [2048, 2048] in this run's model (llama3 1B, dim 2048, 16 layers, 32 heads,"
        " 8 kv heads, vocab 2048, tied embeddings); the checkpoint's model: llama3 debugmodel (dim 256, 6 layers,"
        " 16 heads, 4 kv heads, vocab 2048); to resume from it set --model.flavor=debugmodel, or train this model"
        " in another job.dump_folder (or checkpoint.folder)"
    )
    assert "parallelism:" not in r.stdout and listing(ck) == ["step-3"]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_model_fix_names_the_flags_to_set():
    """The advice of the message above, for recorded models that a config can match."""
    import dataclasses

    from torchtitan.checkpoint.compat import _model_fix
    from torchtitan.config import parse_args
    from torchtitan.models import build_model_args

    cfg = parse_args(["--job.config_file=train_configs/debug_model.toml"]).model
    ours = build_model_args("llama3", "debugmodel")
    tok = {"path": "/t/debug.model", "vocab_size": 2048}
    one_b = {"name": "llama3", "flavor": "1B", "args": dataclasses.asdict(build_model_args("llama3", "1B"))}
    llama_tok = {"path": "/t/tokenizer.json", "vocab_size": 128256}
    assert _model_fix(one_b, llama_tok, tok, cfg, ours, initial=False) == (
        "to resume from it set --model.flavor=1B --model.tokenizer_path=/t/tokenizer.json, or train this model in"
        " another job.dump_folder (or checkpoint.folder)"
    )
    one_b["args"]["vocab_size"] = 512
    unnamed = {"name": "llama3", "flavor": None, "args": one_b["args"]}
    assert _model_fix(unnamed, None, tok, cfg, ours, initial=True) == (
        "to load it set --model.flavor=1B --model.vocab_size=512 and its tokenizer, or point"
        " checkpoint.initial_load_path at a checkpoint of this model"
    )
    small = {"name": "llama3", "flavor": "debugmodel", "args": dict(dataclasses.asdict(ours), vocab_size=512)}
    assert _model_fix(small, tok, tok, cfg, ours, initial=False).startswith(
        "to resume from it set --model.vocab_size=512 and its tokenizer, or"
    )
    same = {"name": "llama3", "flavor": "debugmodel", "args": dataclasses.asdict(ours)}
    assert _model_fix(same, tok, tok, cfg, ours, initial=False).startswith(
        "the model definition changed since it was written (same config, other shapes)"
    )


# ------------------------------------------------------------------------------------------------ HF files


def test_hf_conversion_outputs_carry_checksums(tmp_path):
    from torchtitan.checkpoint.hf import (
        dcp_to_hf,
        hf_config_from_model_args,
        hf_to_dcp,
        load_dcp_model,
        ours_to_hf,
        read_hf_checkpoint,
        write_hf_checkpoint,
    )
    from torchtitan.models.llama3 import ModelArgs, Transformer

    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
    model = Transformer(args)
    model.init_weights(seed=0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    write_hf_checkpoint(tmp_path / "hf", hf_config_from_model_args(args), ours_to_hf(sd, args), 40_000)
    marker = json.loads((tmp_path / "hf" / MARKER).read_text())
    shards = sorted(f for f in marker["files"] if f.endswith(".safetensors"))
    assert len(shards) > 1 and "model.safetensors.index.json" in marker["files"]
    hf_to_dcp(tmp_path / "hf", tmp_path / "dcp")
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", args)
    verify_checkpoint(str(tmp_path / "back"), checksums=True)
    assert json.loads((tmp_path / "dcp" / MARKER).read_text())["model"]["args"]["dim"] == 64
    for folder, name, read in (
        (tmp_path / "hf", shards[0], read_hf_checkpoint),
        (tmp_path / "dcp", "__0_0.distcp", load_dcp_model),
    ):
        f = folder / name
        raw = bytearray(f.read_bytes())
        raw[-100] ^= 0xFF
        f.write_bytes(bytes(raw))
        with pytest.raises(
            UserError, match=rf"checkpoint file {f} of step 0 is corrupt: xxh3_64 checksum \w+, expected"
        ):
            read(folder)


# ------------------------------------------------------------------------------------------------ data sources


def _data_error(path, **kw) -> str:
    from torchtitan.data import build_dataloader, build_tokenizer

    tok = build_tokenizer("tests/assets/tokenizer/debug.model")
    with pytest.raises(UserError) as e:
        for _ in build_dataloader("x", str(path), "text", tok, 0, 1, 2, 64, infinite=False, **kw):
            pass
    return str(e.value)


def test_corrupt_data_file_in_the_trainer_is_one_line(tmp_path):
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"text": "one good line"}\n{"text": broken\n')
    r = run_train(
        1,
        TINY + ["--training.steps=1", f"--job.dump_folder={tmp_path / 'run'}", f"--data.dataset_path={bad}"],
    )
    assert r.returncode == 2
    assert error_line(r) == (
        f"error: data.dataset_path {bad}: {bad} is not valid JSON lines (ArrowInvalid: JSON parse error: Invalid"
        " value. in row 1); fix or remove it"
    )


def test_data_failures_name_the_file(tmp_path, monkeypatch):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(4):
        (folder / f"part{i}.jsonl").write_text(
            "".join(f'{{"text": "doc {i} {j} words"}}\n' for j in range(40))
        )
    (folder / "part2.jsonl").write_text('{"text": "fine"}\n' * 30 + "not json\n")  # damaged in its middle
    assert _data_error(folder) == (
        f"data.dataset_path {folder}: {folder / 'part2.jsonl'} is not valid JSON lines (ArrowInvalid: JSON parse"
        " error: Invalid value. in row 30); fix or remove it"
    )
    gz = tmp_path / "plain.jsonl.gz"
    gz.write_text('{"text": "not compressed at all"}\n')
    assert _data_error(gz).startswith(
        f"data.dataset_path {gz}: {gz} is not valid JSON lines compressed as .gz ("
    )
    pq = tmp_path / "broken.parquet"
    pq.write_bytes(b"PAR1 not really")
    assert f"{pq} is not valid Parquet (ArrowInvalid: " in _data_error(pq)
    txt = tmp_path / "binary.txt"
    txt.write_bytes(b"\xff\xfe\x00\x81 binary")
    assert f"{txt} is not valid UTF-8 text (UnicodeDecodeError: " in _data_error(txt)
    empty = tmp_path / "empty_texts.jsonl"
    empty.write_text('{"text": ""}\n' * 5)
    assert _data_error(empty) == (
        f"data.dataset_path {empty} gives no non-empty 'text' documents (zero tokens) to data-parallel rank 0 of 1;"
        " use more data or fewer data-parallel ranks"
    )
    # An unreadable folder. As root (tests here often are) permissions do not stop reads, so the listing's
    # PermissionError is injected where os.walk would meet it.
    locked = folder / "locked"
    locked.mkdir()
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert (
        _data_error(folder) == f"data.dataset_path {folder}: cannot read folder {locked}: Permission denied"
    )


# ------------------------------------------------------------------------------------------------ output paths


def test_unwritable_outputs_fail_before_any_process_group(tmp_path):
    afile = tmp_path / "a_file"
    afile.write_text("")
    r = run_train(1, TINY + ["--training.steps=1", f"--job.dump_folder={afile}"])
    assert r.returncode == 2
    assert (
        error_line(r) == f"error: job.dump_folder {afile} cannot be created: {afile} is a file, not a folder"
    )
    assert r.stdout == ""  # not even the logger was started
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "tb").write_text("")
    r = run_train(1, TINY + ["--training.steps=1", f"--job.dump_folder={tmp_path / 'd'}"])
    assert r.returncode == 2
    tb = tmp_path / "d" / "tb"
    assert error_line(r) == f"error: TensorBoard folder {tb} cannot be created: {tb} is a file, not a folder"
    (tmp_path / "e" / "metrics.jsonl").mkdir(parents=True)
    r = run_train(1, TINY + ["--training.steps=1", f"--job.dump_folder={tmp_path / 'e'}"])
    assert r.returncode == 2
    jsonl = tmp_path / "e" / "metrics.jsonl"
    assert (
        error_line(r) == f"error: metrics file {jsonl} is a folder; the run writes its metrics into that file"
    )


def test_preflight_warns_when_checkpoints_will_not_fit(tmp_path, monkeypatch, capsys):
    from torchtitan import preflight
    from torchtitan.checkpoint import folder as checkpoint

    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 100 * 2**20)
    code = preflight.main(
        [
            "--job.config_file=train_configs/debug_model.toml",
            "--training.seq_len=64",
            f"--job.dump_folder={tmp_path}",
            "--checkpoint.enable=true",
            "--checkpoint.keep_latest_k=2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out  # a warning, not a failure
    assert (
        f"preflight: disk       WARN  checkpoint folder {tmp_path / 'checkpoint'} has 100.0 MiB free, less than"
        " the ~191.4 MiB its checkpoints need (3 of ~63.8 MiB: checkpoint.keep_latest_k=2 kept + 1 being written,"
        " less those already there)" in out
    )


# ------------------------------------------------------------------------------------------------ async staging


def test_async_stager_is_built_once_and_reuses_its_buffers(tmp_path):
    """CPU proxy of the pinned-staging change: one DefaultStager serves every async save and stages into the
    same buffers each time (on CUDA they are pinned; that path never ran here, see docs/checkpointing.md)."""
    script = tmp_path / "stager.py"
    script.write_text(
        f"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, {str(ROOT)!r})
from torchtitan.checkpoint import CheckpointManager
from torchtitan.config import parse_args
from torchtitan.optim import build_lr_scheduler, build_optimizer
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
cfg = parse_args(["--job.dump_folder={tmp_path}/run", "--checkpoint.enable=true", "--checkpoint.async_mode=async"])
model = torch.nn.Linear(64, 64)
opt = build_optimizer([model], cfg)
m = CheckpointManager(cfg, [model], opt, build_lr_scheduler(opt, cfg), None, rank=0, dp_rank=0, dp=1)
stager, staged = m.stager, []
real = stager.stage
stager.stage = lambda sd, **kw: staged.append(real(sd, **kw)) or staged[-1]
for step in (1, 2):
    model.weight.data.add_(1.0)
    m.save(step, 0)
    m.wait()
assert m.stager is stager and len(staged) == 2
a, b = (s["model"]["weight"] for s in staged)
assert a.data_ptr() == b.data_ptr(), "staging buffer reallocated"
assert torch.equal(b, model.weight.detach())
m.close()
dist.destroy_process_group()
print("ok", type(stager).__name__)
"""
    )
    r = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", "DefaultStager"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="pinned staging needs CUDA")
def test_async_stager_stages_cuda_tensors_into_reused_pinned_memory():
    """On CUDA: the run's stager copies device tensors into pinned host memory, the same buffers at every save,
    on every torch (on torch 2.11, whose DefaultStager cannot stage twice, through BlockingAsyncStager's cache)."""
    import torch

    from torchtitan.checkpoint import build_stager, stager_for_save

    stager = build_stager()
    assert stager is not None, "torch without DefaultStager"
    w = torch.randn(256, 256, device="cuda")
    try:
        first = stager.stage({"w": w})["w"]
        assert torch.equal(first, w.cpu())
        w.add_(1.0)
        assert stager_for_save(stager) is stager
        second = stager.stage({"w": w})["w"]
    finally:
        stager.close()
    assert second.device.type == "cpu" and second.is_pinned()
    assert torch.equal(second, w.cpu())
    assert second.data_ptr() == first.data_ptr(), "staging buffer reallocated"


def test_a_stager_torch_cannot_reuse_is_replaced_at_every_save(monkeypatch):
    """torch 2.11's DefaultStager breaks on its second stage() (pytorch#183413): the probe says so; on CUDA the run
    then stages through BlockingAsyncStager's cached pinned copy, and without CUDA each save gets a fresh
    DefaultStager, so the second async save of a run does not fail."""
    import torch
    from torch.distributed.checkpoint.staging import BlockingAsyncStager, DefaultStager

    from torchtitan.checkpoint import staging as checkpoint

    first = checkpoint.build_stager()
    assert first is not None, "torch without DefaultStager"
    if checkpoint.stager_survives_reuse():
        assert isinstance(first, DefaultStager)
        assert checkpoint.stager_for_save(first) is first  # this torch reuses it
    monkeypatch.setattr(checkpoint, "stager_survives_reuse", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    second = checkpoint.stager_for_save(first)
    assert isinstance(second, DefaultStager) and second is not first
    w = torch.arange(6.0)
    assert torch.equal(second.stage({"w": w})["w"], w)
    first.close()
    second.close()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cached = (
        checkpoint.build_stager()
    )  # what a CUDA run gets on such a torch (its staging needs a GPU: test above)
    assert isinstance(cached, BlockingAsyncStager) and cached.cache_staged_state_dict
    assert checkpoint.stager_for_save(cached) is cached
