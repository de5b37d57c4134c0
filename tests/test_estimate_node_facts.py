"""This node's GPUs as the estimator needs them (torchtitan/estimate/node_facts.py), read from nvidia-smi's text as
the driver prints it, and carried into a plan by the flags the preflight prints."""

from __future__ import annotations

import subprocess

import pytest

from torchtitan import preflight
from torchtitan.config import parse_args
from torchtitan.estimate import estimate_training
from torchtitan.estimate.node_facts import NodeFacts, parse_power, parse_topology, probe

_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def _matrix(links: list[list[str]], nics: int = 2) -> str:
    """`nvidia-smi topo -m` as the driver lays it out: tab-separated, GPU columns, NIC columns, affinities."""
    n = len(links)
    cols = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)]
    out = ["\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for i, row in enumerate(links):
        nic = ["PXB" if j == i % max(nics, 1) else "SYS" for j in range(nics)]
        out.append(
            f"GPU{i}\t" + "\t".join(row + nic) + f"\t{0 if i < n // 2 else 32}-31\t{i * 2 // n}\t\tN/A"
        )
    for j in range(nics):
        out.append(f"NIC{j}\t" + "\t".join(["SYS"] * n + [" X " if k == j else "SYS" for k in range(nics)]))
    return "\n".join(out) + "\n" + _LEGEND


def _all_pairs(n: int, cell: str) -> list[list[str]]:
    return [[" X " if i == j else cell for j in range(n)] for i in range(n)]


@pytest.mark.parametrize(
    "board, links, expected",
    [
        ("HGX H100 / H200 4-GPU: 6 of 18 NVLinks to each peer", _all_pairs(4, "NV6"), (4, "mesh", 6)),
        ("HGX A100 4-GPU: 4 of 12 to each peer", _all_pairs(4, "NV4"), (4, "mesh", 4)),
        ("DGX H100: every GPU's 18 through NVSwitch", _all_pairs(8, "NV18"), (8, "switch", 18)),
        ("DGX A100: 12 through NVSwitch", _all_pairs(8, "NV12"), (8, "switch", 12)),
        ("two GPUs bridged", _all_pairs(2, "NV12"), (2, "switch", 12)),
        (
            "H100 NVL pairs bridged, PCIe between pairs",
            [
                [" X " if i == j else ("NV12" if i // 2 == j // 2 else "SYS") for j in range(4)]
                for i in range(4)
            ],
            (4, None, None),
        ),
        ("PCIe only", _all_pairs(8, "NODE"), (8, None, None)),
        ("one GPU", _all_pairs(1, "NV18"), (1, None, None)),
    ],
)
def test_the_topology_is_read_off_nvidia_smis_matrix(board, links, expected):
    """A pair reported with k NVLinks on a node of n GPUs whose k x (n - 1) fits in one GPU's 18 links is joined
    directly (a mesh: the 4-GPU boards, NV6 / NV4); a node whose every pair reports a GPU's whole link count goes
    through switches (NV18 / NV12); anything not NVLink between every pair is neither."""
    assert parse_topology(_matrix(links)) == expected, board


def test_the_power_limit_in_force_and_the_default_are_read_from_the_query():
    assert parse_power("NVIDIA H100 80GB HBM3, 500.00, 700.00\nNVIDIA H100 80GB HBM3, 500.00, 700.00\n") == (
        "NVIDIA H100 80GB HBM3",
        500.0,
        700.0,
    )
    assert parse_power("NVIDIA GH200 480GB, [N/A], [N/A]\n") == ("NVIDIA GH200 480GB", None, None)


def test_the_flags_carry_only_what_differs_from_the_estimators_defaults_and_the_estimator_takes_them():
    """A capped 4-GPU board gets its cap and its mesh; an 8-GPU NVSwitch node at its default power gets nothing to
    add. The printed flags are the estimator's own options: a plan built with them prices the capped mesh (slower
    compute at 500 W, a TP group of 2 with a third of the node's NVLink)."""
    capped = NodeFacts(4, "NVIDIA H100 80GB HBM3", 500.0, 700.0, "mesh", 6)
    flags = capped.estimate_flags()
    assert flags == [
        "--estimate.power_limit_w=500",
        "--estimate.devices_per_node=4",
        "--estimate.intra_node_topology=mesh",
    ]
    assert "plan with --estimate.power_limit_w=500 --estimate.devices_per_node=4" in capped.describe()
    assert "NVLink mesh, no switch (NV6 between each pair)" in capped.describe()
    assert NodeFacts(8, "NVIDIA H100 80GB HBM3", 700.0, 700.0, "switch", 18).estimate_flags() == []
    base = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=4",
            "--parallelism.tensor_parallel_degree=2", "--training.local_batch_size=1"]  # fmt: skip
    node = estimate_training(parse_args([*base, *flags]))
    assert node["hardware"]["compute_power_w"] == 500.0
    assert node["hardware"]["intra_node_topology"] == "mesh"
    assert node["step_time_s"] > estimate_training(parse_args(base))["step_time_s"]


def test_probe_runs_nvidia_smi_and_the_preflight_prints_the_node(monkeypatch, capsys):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        out = _matrix(_all_pairs(4, "NV6")) if cmd[1] == "topo" else "NVIDIA H200, 600.00, 700.00\n" * 4
        return subprocess.CompletedProcess(cmd, 0, stdout=out)

    facts = probe(run=fake_run)
    assert facts == NodeFacts(4, "NVIDIA H200", 600.0, 700.0, "mesh", 6)
    assert [c[:2] for c in calls] == [["nvidia-smi", "--query-gpu=name,power.limit,power.default_limit"],
                                      ["nvidia-smi", "topo"]]  # fmt: skip

    def failing(cmd, **kw):
        raise subprocess.CalledProcessError(9, cmd)

    assert probe(run=failing) is None

    def missing(cmd, **kw):  # no NVIDIA driver on this machine
        raise FileNotFoundError(2, "No such file or directory", cmd[0])

    assert probe(run=missing) is None
    monkeypatch.setattr("torchtitan.estimate.node_facts.probe", lambda: facts)
    assert preflight.node_facts() == (
        "4 x NVIDIA H200; power limit 600 W (the part's default 700 W); NVLink mesh, no switch (NV6 between each"
        " pair): plan with --estimate.power_limit_w=600 --estimate.devices_per_node=4"
        " --estimate.intra_node_topology=mesh"
    )
    monkeypatch.setattr("torchtitan.estimate.node_facts.probe", lambda: None)
    assert "no nvidia-smi here" in preflight.node_facts()
