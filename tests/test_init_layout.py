"""The full initial weights for a seed do not depend on the parallel layout (see DESIGN.md); and how parallelize
wraps the model in those layouts (FSDP units, or autocast where nothing is sharded)."""

import json

import torch

from conftest import run_script

LAYERS = [f"layers.{i}" for i in range(6)]


def dump(tmp_path, nproc, *args, structure=None):
    out = tmp_path / f"init_{nproc}_{len(args)}_{abs(hash(args))}.pt"
    r = run_script(nproc, "tests/dist/dump_init.py", [str(out), *args], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    if structure is not None:
        structure.update(json.loads((tmp_path / f"{out.name}.json").read_text()))
    return torch.load(out, weights_only=True)


def test_fsdp2_init_equals_single_process(tmp_path):
    s1, s2 = {}, {}
    one = dump(tmp_path, 1, structure=s1)
    two = dump(tmp_path, 2, "--training.seed=0", structure=s2)
    # one process: no FSDP at all; bf16 comes from autocast (fp32 parameters, bf16 logits)
    assert s1 == {"fsdp_units": [], "param_dtypes": ["torch.float32"], "logits_dtype": "torch.bfloat16"}
    # FSDP 2: the embedding, every block and the norm + output head are units of their own, then the root
    assert s2["fsdp_units"] == ["", "tok_embeddings", *LAYERS, "norm", "output"]
    assert s2["logits_dtype"] == "torch.bfloat16"
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
        structure = {}
        tp = dump(tmp_path, nproc, *args, structure=structure)
        # TP-only has one dp rank: no FSDP, autocast; FSDP 2 x TP 2 has the same units as FSDP 2
        assert structure["fsdp_units"] == (
            [] if nproc == 2 else ["", "tok_embeddings", *LAYERS, "norm", "output"]
        )
        assert structure["logits_dtype"] == "torch.bfloat16"
        assert one.keys() == tp.keys()
        for k in one:
            assert torch.equal(one[k], tp[k]), (args, k)
