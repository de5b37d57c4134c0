"""The full initial weights for a seed do not depend on the parallel layout (see DESIGN.md, docs/model.md); and
how parallelize wraps the model in those layouts (FSDP units, or autocast where nothing is sharded).

Each layout's ranks compute only the elements they hold (torchtitan.parallel.local_coords); gathered back, they
must equal the single-process weights exactly.
"""

import json

import pytest
import torch

from conftest import run_script

LAYERS = [f"layers.{i}" for i in range(6)]
UNITS = [
    "",
    "tok_embeddings",
    *LAYERS,
    "norm",
    "output",
]  # embedding, every block, norm + head, then the root


def dump(tmp_path, nproc, *args, structure=None):
    """The full weights of a run in this layout: every rank's parameters, merged by name (all copies equal).
    `structure` (a dict) receives how parallelize wrapped the model (not under pipeline parallelism)."""
    out = tmp_path / f"init_{nproc}_{len(args)}_{abs(hash(args))}.pt"
    r = run_script(nproc, "tests/dist/dump_init.py", [str(out), *args], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    if structure is not None:
        structure.update(json.loads((tmp_path / f"{out.name}.json").read_text()))
    full = {}
    for rank in range(nproc):
        for name, value in torch.load(f"{out}.{rank}", weights_only=True).items():
            if name in full:  # held by several ranks (FSDP/TP peers): each gathered the same full value
                assert torch.equal(full[name], value), (args, name, rank)
            full[name] = value
    return full


def assert_same(one, other, what):
    assert one.keys() == other.keys(), what
    for k in one:
        assert torch.equal(one[k], other[k]), (what, k)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process weights (and how parallelize wrapped them), which every layout below is compared with:
    one run for the whole file."""
    s1 = {}
    return dump(tmp_path_factory.mktemp("single"), 1, structure=s1), s1


def test_fsdp2_init_equals_single_process(single, tmp_path):
    one, s1 = single
    s2 = {}
    assert len(one) > 10
    assert_same(one, dump(tmp_path, 2, "--training.seed=0", structure=s2), "FSDP 2")
    # one process: no FSDP at all; bf16 comes from autocast (fp32 parameters, bf16 logits)
    assert s1 == {"fsdp_units": [], "param_dtypes": ["torch.float32"], "logits_dtype": "torch.bfloat16"}
    assert s2["fsdp_units"] == UNITS
    assert s2["logits_dtype"] == "torch.bfloat16"
    other_seed = dump(tmp_path, 1, "--training.seed=1")
    assert not torch.equal(one["layers.0.attention.wq.weight"], other_seed["layers.0.attention.wq.weight"])


def test_tp_layouts_init_equals_single_process(single, tmp_path):
    """FSDP 2 x TP 2 (weights are 2-D DTensors, FSDP's dim-0 shard strided over TP's) and TP 2 without
    sequence parallel (norm gains then stay plain tensors under TP) hold the same full weights as 1 process."""
    one, _ = single
    for nproc, args in [
        (4, ["--parallelism.tensor_parallel_degree=2"]),
        (2, ["--parallelism.tensor_parallel_degree=2", "--parallelism.enable_sequence_parallel=false"]),
    ]:
        structure = {}
        assert_same(one, dump(tmp_path, nproc, *args, structure=structure), args)
        # TP-only has one dp rank: no FSDP, autocast; FSDP 2 x TP 2 has the same units as FSDP 2
        assert structure["fsdp_units"] == ([] if nproc == 2 else UNITS)
        assert structure["logits_dtype"] == "torch.bfloat16"


def test_pp_and_cp_layouts_init_equals_single_process(single, tmp_path):
    """PP 2 (each rank holds a stage: half the layers, the embedding or the head) and CP 2 (FSDP shards over the
    cp ranks) hold the same full weights as 1 process."""
    one, _ = single
    pp = dump(tmp_path, 2, "--parallelism.pipeline_parallel_degree=2")
    assert_same(one, pp, "PP 2")
    assert_same(one, dump(tmp_path, 2, "--parallelism.context_parallel_degree=2"), "CP 2")
