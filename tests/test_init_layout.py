"""The full initial weights for a seed do not depend on the parallel layout (see DESIGN.md)."""

import torch

from conftest import run_script


def dump(tmp_path, nproc, *args):
    out = tmp_path / f"init_{nproc}_{len(args)}_{abs(hash(args))}.pt"
    r = run_script(nproc, "tests/dist/dump_init.py", [str(out), *args], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=True)


def test_fsdp2_init_equals_single_process(tmp_path):
    one = dump(tmp_path, 1)
    two = dump(tmp_path, 2, "--training.seed=0")
    assert one.keys() == two.keys() and len(one) > 10
    for k in one:
        assert torch.equal(one[k], two[k]), k
    other_seed = dump(tmp_path, 1, "--training.seed=1")
    assert not torch.equal(one["layers.0.attention.wq.weight"], other_seed["layers.0.attention.wq.weight"])


def test_tp_layouts_init_equals_single_process(tmp_path):
    """FSDP 2 x TP 2 (weights are 2-D DTensors, FSDP's dim-0 shard strided over TP's) and TP 2 without
    sequence parallel (norm gains then stay plain tensors under TP) hold the same full weights as 1 process."""
    one = dump(tmp_path, 1)
    for nproc, args in [
        (4, ["--parallelism.tensor_parallel_degree=2"]),
        (2, ["--parallelism.tensor_parallel_degree=2", "--parallelism.enable_sequence_parallel=false"]),
    ]:
        tp = dump(tmp_path, nproc, *args)
        assert one.keys() == tp.keys()
        for k in one:
            assert torch.equal(one[k], tp[k]), (args, k)
