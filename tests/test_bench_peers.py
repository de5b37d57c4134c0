"""scripts/bench_peers.py compares like with like: the trainer and transformers' LlamaForCausalLM start from the
same weights and see the same tokens (equal first losses). Run with both sides compiled, the path with the most
code (the eager path is the same minus the compile calls)."""

import json

import pytest

from conftest import run_script, train_env


def test_trainer_and_transformers_see_the_same_model_and_data():
    pytest.importorskip("transformers")
    args = ["--dtype=float32", "--batch=1", "--seq-len=32", "--steps=2", "--interval=1", "--warmup=0"]
    args += ["--repeat=1", "--threads=1", "--", "--compile.enable=true"]
    r = run_script(1, "scripts/bench_peers.py", args, env=train_env())
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout[r.stdout.index("{") :])["float32"]
    assert result["trainer_tokens_per_sec"] > 0 and result["hf_tokens_per_sec"] > 0
    ours, theirs = result["first_loss_trainer_hf"]
    assert ours == pytest.approx(theirs, abs=2e-4), (ours, theirs)
    assert ours > 7.0  # ~ln(2048) = 7.6 at init: a real model, not a constant
