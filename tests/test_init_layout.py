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


# name: (processes, arguments). Every layout is dumped once, all layouts of one world size in one run
# (tests/dist/dump_init.py --many).
LAYOUTS = {
    "single": (1, []),
    "seed1": (1, ["--training.seed=1"]),
    "fsdp2": (2, ["--training.seed=0"]),
    "tp2_no_sp": (
        2,
        ["--parallelism.tensor_parallel_degree=2", "--parallelism.enable_sequence_parallel=false"],
    ),
    "pp2": (2, ["--parallelism.pipeline_parallel_degree=2"]),
    "cp2": (2, ["--parallelism.context_parallel_degree=2"]),
    "fsdp2_tp2": (4, ["--parallelism.tensor_parallel_degree=2"]),
}


def merged(out, nproc, what):
    """The full weights of a run in this layout: every rank's parameters, merged by name (all copies equal)."""
    full = {}
    for rank in range(nproc):
        for name, value in torch.load(f"{out}.{rank}", weights_only=True).items():
            if name in full:  # held by several ranks (FSDP/TP peers): each gathered the same full value
                assert torch.equal(full[name], value), (what, name, rank)
            full[name] = value
    return full


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """name -> (full weights, how parallelize wrapped the model: a dict, empty under pipeline parallelism)."""
    tmp = tmp_path_factory.mktemp("init")
    result = {}
    for nproc in sorted({n for n, _ in LAYOUTS.values()}):
        names = [name for name, (n, _) in LAYOUTS.items() if n == nproc]
        spec = tmp / f"{nproc}.json"
        spec.write_text(json.dumps([[str(tmp / f"{name}.pt"), *LAYOUTS[name][1]] for name in names]))
        r = run_script(nproc, "tests/dist/dump_init.py", ["--many", str(spec)], timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        for name in names:
            wrapped = tmp / f"{name}.pt.json"
            structure = json.loads(wrapped.read_text()) if wrapped.exists() else {}
            result[name] = merged(tmp / f"{name}.pt", nproc, name), structure
    return result


def assert_same(one, other, what):
    assert one.keys() == other.keys(), what
    for k in one:
        assert torch.equal(one[k], other[k]), (what, k)


def test_fsdp2_init_equals_single_process(dumps):
    one, s1 = dumps["single"]
    fsdp2, s2 = dumps["fsdp2"]
    assert len(one) > 10
    assert_same(one, fsdp2, "FSDP 2")
    # one process: no FSDP at all; bf16 comes from autocast (fp32 parameters, bf16 logits)
    assert s1 == {"fsdp_units": [], "param_dtypes": ["torch.float32"], "logits_dtype": "torch.bfloat16"}
    assert s2["fsdp_units"] == UNITS
    assert s2["logits_dtype"] == "torch.bfloat16"
    other_seed, _ = dumps["seed1"]
    assert not torch.equal(one["layers.0.attention.wq.weight"], other_seed["layers.0.attention.wq.weight"])


def test_tp_layouts_init_equals_single_process(dumps):
    """FSDP 2 x TP 2 (weights are 2-D DTensors, FSDP's dim-0 shard strided over TP's) and TP 2 without
    sequence parallel (norm gains then stay plain tensors under TP) hold the same full weights as 1 process."""
    one, _ = dumps["single"]
    for name in ("fsdp2_tp2", "tp2_no_sp"):
        full, structure = dumps[name]
        assert_same(one, full, LAYOUTS[name][1])
        # TP-only has one dp rank: no FSDP, autocast; FSDP 2 x TP 2 has the same units as FSDP 2
        assert structure["fsdp_units"] == ([] if name == "tp2_no_sp" else UNITS)
        assert structure["logits_dtype"] == "torch.bfloat16"


def test_pp_and_cp_layouts_init_equals_single_process(dumps):
    """PP 2 (each rank holds a stage: half the layers, the embedding or the head) and CP 2 (FSDP shards over the
    cp ranks) hold the same full weights as 1 process."""
    one, _ = dumps["single"]
    assert_same(one, dumps["pp2"][0], "PP 2")
    assert_same(one, dumps["cp2"][0], "CP 2")
