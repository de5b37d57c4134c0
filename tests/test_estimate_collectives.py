"""NCCL collective times by size, rank count and topology (torchtitan/estimate/collectives.py; sources there)."""

from __future__ import annotations

import pytest

from torchtitan.config import ConfigError, parse_args
from torchtitan.errors import UserError
from torchtitan.estimate import collectives
from torchtitan.estimate.plan import build_plan


def _plan(hardware: str, devices: int):
    cfg = parse_args(
        [
            "--model.flavor=debugmodel",
            f"--estimate.hardware={hardware}",
            f"--estimate.num_devices={devices}",
        ]
    )
    return build_plan(cfg)


H100 = _plan("h100-sxm", 64)
A100 = _plan("a100", 64)
NVL = 450e9 * 0.80  # NVLink 4 per direction x the nccl-tests ring fraction
NIC = 50e9 * 0.96


def test_group_layout_follows_the_stride():
    assert collectives.group_layout(H100, 8, 1) == (8, 1)  # one node
    assert collectives.group_layout(H100, 64, 1) == (8, 8)  # FSDP over 8 nodes
    assert collectives.group_layout(H100, 8, 8) == (1, 8)  # FSDP across nodes with TP 8 inside each node
    assert collectives.group_layout(H100, 16, 4) == (2, 8)


def test_busbw_inside_a_node_is_nvlink_and_across_nodes_the_nics_of_the_group():
    assert collectives.busbw(H100, NVL, NIC, 8, 1) == NVL
    # every GPU of the node in the ring: 8 NICs side by side (384 GB/s), capped by the NVLink ring (360)
    assert collectives.busbw(H100, NVL, NIC, 64, 1) == pytest.approx(min(NVL, 8 * NIC))
    # one GPU per node (TP 8 holds the node): one NIC
    assert collectives.busbw(H100, NVL, NIC, 8, 8) == NIC
    assert collectives.busbw(H100, NVL, NIC, 16, 4) == pytest.approx(2 * NIC)
    # DGX A100 (8 x 200 Gb/s): NVIDIA measures 192 GB/s of ring bus bandwidth across nodes (NVIDIA/nccl#812)
    a = A100.hw
    bw = collectives.busbw(A100, a.intra_node_gbps * 1e9 * 0.80, a.inter_node_gbps * 1e9 * 0.96, 64, 1)
    assert bw == pytest.approx(192e9)


def test_ring_latency_counts_nvlink_and_network_steps():
    # 8 ranks in a node: base + 7 NVLink hops
    assert collectives.ring_latency(H100, 8, 1) == pytest.approx(8.4e-6 + 7 * 3.4e-6)
    # 64 ranks on 8 nodes: 56 NVLink steps and 7 network steps (14.0 us each, NCCL 2.21.5); all-reduce twice
    one = 8.4e-6 + 56 * 3.4e-6 + 7 * 14.0e-6
    assert collectives.ring_latency(H100, 64, 1) == pytest.approx(one)
    assert collectives.ring_latency(H100, 64, 1, 2) == pytest.approx(8.4e-6 + 2 * (one - 8.4e-6))


def test_ring_time_is_latency_bound_small_and_bandwidth_bound_large():
    small = collectives.ring_time(H100, NVL, NIC, 1e3, 64, 1, "all_gather")
    assert small == pytest.approx(collectives.ring_latency(H100, 64, 1), rel=1e-3)
    big = 1e9
    t = collectives.ring_time(H100, NVL, NIC, big, 64, 1, "all_gather")
    assert t == pytest.approx(collectives.ring_latency(H100, 64, 1) + big * 63 / 64 / NVL)
    ar = collectives.ring_time(H100, NVL, NIC, big, 64, 1, "all_reduce")
    assert ar == pytest.approx(collectives.ring_latency(H100, 64, 1, 2) + 2 * big * 63 / 64 / NVL)
    assert collectives.ring_time(H100, NVL, NIC, big, 1, 1, "all_gather") == 0.0


def test_p2p_uses_one_link():
    assert collectives.p2p_time(H100, NVL, NIC, 1e9, 1) == pytest.approx(8.4e-6 + 3.4e-6 + 1e9 / NVL)
    assert collectives.p2p_time(H100, NVL, NIC, 1e9, 64) == pytest.approx(8.4e-6 + 14.0e-6 + 1e9 / NIC)


def test_overlapped_ring_takes_its_channels_sms():
    # NVLink-speed ring: all of NCCL's channels (H100: 16 of 132 SMs; A100: 24 of 108)
    assert collectives.overlap_sm_share(H100, NVL, NVL) == pytest.approx(16 / 132)
    a100_intra = A100.hw.intra_node_gbps * 1e9 * 0.80
    assert collectives.overlap_sm_share(A100, a100_intra, a100_intra) == pytest.approx(24 / 108)
    # one NIC per node: the channels of one NIC's bandwidth only
    assert collectives.overlap_sm_share(H100, NIC, NVL) == pytest.approx(16 * NIC / NVL / 132)
    # a ring over whole nodes (every GPU and its NIC) keeps the node's channels, whatever its bus bandwidth
    assert collectives.overlap_sm_share(A100, 192e9, a100_intra, full_nodes=True) == pytest.approx(24 / 108)
    assert collectives.overlap_sm_share(A100, 192e9, a100_intra) == pytest.approx(
        24 * 192e9 / a100_intra / 108
    )


def test_blackwell_nvlink5_rings_as_measured():
    """NVLink 5 rings: 32 NCCL channels (a DGX B200's NCCL log, NVIDIA/nccl#1646) of 148 SMs on every Blackwell part,
    and the bus bandwidth nccl-tests measured on 8 B200 with NVLink SHARP off (682.2 GB/s of 900); Hopper keeps 16
    channels and NVIDIA's 0.80 of NVLink 4."""
    for device in ("B200", "GB200", "B300", "GB300"):
        assert collectives.node_channels(device) == 32
        assert collectives.intra_fraction(device, 0.80) == pytest.approx(682.2 / 900.0)
        plan = build_plan(
            parse_args(
                [
                    "--model.flavor=debugmodel",
                    f"--estimate.hardware={device.lower()}",
                    "--estimate.num_devices=8",
                ]
            )
        )
        intra = plan.hw.intra_node_gbps * 1e9 * collectives.intra_fraction(device, 0.80)
        assert intra == pytest.approx(682.2e9)
        assert collectives.overlap_sm_share(plan, intra, intra) == pytest.approx(32 / 148)
    assert (
        collectives.node_channels("H100 SXM") == 16 and collectives.intra_fraction("H100 SXM", 0.80) == 0.80
    )


def test_fsdp_overlap_charges_held_sms_only_where_compute_sets_the_pace():
    """A unit's collectives and its compute run side by side and the unit ends when both have: compute-bound units
    pay the SMs the rings hold (share x ring time), communication-bound units wait for the rings, and the compute
    slowed under them costs nothing more while it stays shorter than the rings."""
    from torchtitan.estimate import steptime

    plan = build_plan(
        parse_args(["--model.flavor=debugmodel", "--estimate.hardware=a100", "--estimate.num_devices=64"])
    )
    r = steptime.Rates(plan)
    n_blocks, has_emb, has_head = plan.rank_layers()[0]
    units = n_blocks + has_emb + has_head
    share = collectives.overlap_sm_share(plan, 0.0, r.intra, full_nodes=True)  # 64 ranks on 8 whole nodes
    assert share == pytest.approx(24 / 108)
    sizes = [plan.embedding_params() * 2, plan.block_params() * 2, plan.head_params() * 2]
    shortest = min(steptime._ring(plan, r, x, 64, 1) for x in sizes)  # reduce-scatters (fp32) are longer
    total = steptime.fsdp_units(
        plan, r, 0, [(0.0, 0.0)] * units
    )  # no compute: every ring on the critical path
    # compute at half the shortest ring, slowed by the share, still ends before every ring: the rings set the pace,
    # and what they add beyond the compute is their time less the compute they overlap (every forward pass but the
    # last overlaps the next unit's gather, every backward pass a gather and / or a reduce-scatter)
    c = shortest / 2
    overlapped = (2 * units - 1) * c
    assert steptime.fsdp_units(plan, r, 0, [(c, c)] * units) == pytest.approx(total - overlapped)
    # compute far longer than every ring: only the unoverlapped first gather and last reduce-scatters are exposed,
    # and every other ring costs its SMs' share of its own time
    long = steptime.fsdp_units(plan, r, 0, [(1e3, 1e3)] * units)
    assert share * total < long < total


def test_fsdp_gather_copy_in_runs_beside_the_compute(monkeypatch):
    """FSDP2's gather copy-in runs on its own stream before each all-gather: where the compute sets the pace, each
    copy-in a unit's compute overlaps delays that compute by rates.FSDP_GATHER_COPY_IN_CONTENTION of the copy-in's
    time, and only the first gather of forward (the embedding's) is exposed whole; in backward the head stays
    gathered, so every block's and the embedding's re-gather overlaps a backward."""
    from torchtitan.estimate import rates, steptime

    plan = build_plan(
        parse_args(["--model.flavor=debugmodel", "--estimate.hardware=a100", "--estimate.num_devices=64"])
    )
    r = steptime.Rates(plan)
    n_blocks, has_emb, has_head = plan.rank_layers()[0]
    assert has_emb and has_head
    passes = [(1e3, 1e3)] * (n_blocks + 2)
    ci = steptime.fsdp_gather_copy_in(plan)
    assert ci["block"] > 0 and ci["emb"] > 0 and ci["head"] > 0
    full = steptime.fsdp_units(plan, r, 0, passes)
    monkeypatch.setattr(rates, "FSDP_GATHER_COPY_IN_CONTENTION", 0.0)
    free = steptime.fsdp_units(plan, r, 0, passes)
    overlapped = (n_blocks * ci["block"] + ci["head"]) + (n_blocks * ci["block"] + ci["emb"])
    assert full - free == pytest.approx(0.140 * overlapped, rel=1e-9)


def test_memory_bound_compute_beside_a_ring_loses_the_rings_share_of_the_bandwidth():
    """A ring moves 3 bytes of HBM per byte on the bus (NVIDIA/nccl#1428): on an H100 SXM at 360 GB/s that is 0.32 of
    its 3,350 GB/s. In fsdp_units the memory-bound share of each unit's compute beside a collective loses that share
    of its rate in place of the SMs' share: where the compute sets the pace (A100: no persistent GEMMs), moving all
    of it from GEMM-like to memory-bound adds (bandwidth share - SM share) x the overlapped collectives' time."""
    from torchtitan.estimate import steptime

    h100 = build_plan(parse_args(["--model.flavor=debugmodel", "--estimate.hardware=h100-sxm"]))
    assert collectives.overlap_hbm_share(h100, 360e9) == pytest.approx(3 * 360 / 3350)

    plan = build_plan(
        parse_args(["--model.flavor=debugmodel", "--estimate.hardware=a100", "--estimate.num_devices=64"])
    )
    r = steptime.Rates(plan)
    n_blocks, has_emb, has_head = plan.rank_layers()[0]
    units = n_blocks + 2
    ring = collectives.busbw(plan, r.intra, r.inter, 64, 1)
    sm = collectives.overlap_sm_share(plan, ring, r.intra, full_nodes=True)
    hbm = collectives.overlap_hbm_share(plan, ring)
    assert hbm != sm
    size = {"emb": plan.embedding_params(), "block": plan.block_params(), "head": plan.head_params()}
    gathered = {"emb": plan.act_bytes, "block": steptime.gather_bytes(plan, 0.0), "head": plan.act_bytes}
    ag = {k: steptime._ring(plan, r, size[k] * gathered[k], 64, 1) for k in size}
    rs = {k: steptime._ring(plan, r, size[k] * plan.reduce_bytes, 64, 1, "reduce_scatter") for k in size}
    # overlapped: every forward gather but the embedding's (the first), every backward re-gather (the head stays
    # gathered), every reduce-scatter but the embedding's (the last)
    overlapped = (n_blocks * ag["block"] + ag["head"]) + (n_blocks * ag["block"] + ag["emb"])
    overlapped += n_blocks * rs["block"] + rs["head"]
    passes = [(1e3, 1e3)] * units
    memory_bound = steptime.fsdp_units(plan, r, 0, passes, memory=[1.0] * units)
    gemm_like = steptime.fsdp_units(plan, r, 0, passes, memory=[0.0] * units)
    assert memory_bound - gemm_like == pytest.approx((hbm - sm) * overlapped, rel=1e-9)


def test_a_measured_cross_node_busbw_replaces_the_rail_model():
    """--estimate.inter_node_busbw_gbps: nccl-tests' bus bandwidth over the job's nodes (every GPU of each node)
    stands for a ring across nodes that holds whole nodes; a ring with fewer of its ranks on each node gets that
    share of it (its NICs); inside a node nothing changes. On the Ultra-Scale Playbook's AWS cluster all-reduce ran at
    84.7 GB/s on 16 nodes, where 8 NICs at 400 Gb/s give the rail model 360 (ultrascale_playbook_1b_ddp's rows)."""
    from torchtitan.estimate.steptime import Rates

    argv = ["--model.flavor=debugmodel", "--estimate.hardware=h100-sxm", "--estimate.num_devices=128"]
    plan = build_plan(parse_args([*argv, "--estimate.inter_node_busbw_gbps=84.7"]))
    assert plan.hw.inter_node_busbw_gbps == 84.7 and "inter_node_busbw_gbps" in plan.hw.source
    r = Rates(plan)
    assert collectives.busbw(plan, r.intra, r.inter, 128, 1) == pytest.approx(84.7e9)
    assert collectives.busbw(plan, r.intra, r.inter, 32, 4) == pytest.approx(84.7e9 / 4)  # 2 ranks a node
    assert collectives.busbw(plan, r.intra, r.inter, 8, 1) == r.intra  # one node: NVLink
    assert collectives.busbw(H100, NVL, NIC, 128, 1) == pytest.approx(NVL)  # without it: the rail model
    with pytest.raises(UserError, match="inter_node_busbw_gbps"):
        build_plan(parse_args([*argv, "--estimate.inter_node_busbw_gbps=0"]))


def test_a_four_gpu_board_without_nvswitch_is_a_mesh():
    """--estimate.intra_node_topology=mesh: a 4-GPU Hopper board links each GPU to each of its 3 peers with 6 of its
    18 NVLinks, so a TP or FSDP pair on it has a third of the node's bandwidth and a pipeline send to one peer a third
    of the GPU's, while a ring over all 4 keeps the whole (KempnerForge's H200 nodes: kempnerforge_h200's part). auto
    keeps the device's own node: a switch for the H200 on its 8-GPU NVSwitch board (a pair gets all of it) and a
    mesh for 4 H100 / H200 SXM GPUs a node (only the 4-GPU board has that count), the GH200 and the MI300X;
    `switch` overrides."""
    from torchtitan.estimate.steptime import Rates

    def plan(hardware: str, *extra: str):
        argv = [
            "--model.flavor=debugmodel",
            f"--estimate.hardware={hardware}",
            "--estimate.num_devices=8",
            *extra,
        ]
        return build_plan(parse_args(argv))

    switch = plan("h200", "--estimate.devices_per_node=4", "--estimate.intra_node_topology=switch")
    mesh = plan("h200", "--estimate.devices_per_node=4", "--estimate.intra_node_topology=mesh")
    r = Rates(mesh)
    assert not collectives.is_mesh(switch) and collectives.is_mesh(mesh)
    for hw, per_node, meshed in (
        ("h200", 4, True),
        ("h100-sxm", 4, True),
        ("h200", 8, False),
        ("b200", 4, False),
    ):
        assert collectives.is_mesh(plan(hw, f"--estimate.devices_per_node={per_node}")) == meshed, (
            hw,
            per_node,
        )
    assert collectives.busbw(switch, r.intra, r.inter, 2, 1) == pytest.approx(NVL)
    assert collectives.busbw(mesh, r.intra, r.inter, 2, 1) == pytest.approx(NVL / 3)  # 120 GB/s a pair
    assert collectives.busbw(mesh, r.intra, r.inter, 2, 2) == pytest.approx(NVL / 3)  # FSDP 2 under TP 2
    assert collectives.busbw(mesh, r.intra, r.inter, 4, 1) == pytest.approx(NVL)  # the whole node
    assert collectives.busbw(mesh, r.intra, r.inter, 8, 1) == pytest.approx(min(NVL, 4 * NIC))  # two nodes

    def per_gb(p, distance: int) -> float:  # seconds a GB of a send takes beyond its latency
        return collectives.p2p_time(p, r.intra, r.inter, 2e9, distance) - collectives.p2p_time(
            p, r.intra, r.inter, 1e9, distance
        )

    assert per_gb(mesh, 1) == pytest.approx(3 * per_gb(switch, 1))  # the links to that one peer
    assert per_gb(mesh, 4) == pytest.approx(per_gb(switch, 4))  # across nodes: the NIC either way
    assert collectives.is_mesh(plan("gh200")) and collectives.is_mesh(plan("mi300x"))
    mi300x = plan("mi300x", "--estimate.intra_node_topology=switch")
    assert not collectives.is_mesh(mi300x)
    assert collectives.busbw(mi300x, r.intra, r.inter, 2, 1) == r.intra
    # the report and its JSON say which node was priced
    from torchtitan.estimate.report import training_report
    from torchtitan.estimate.training import estimate_plan

    for p, topology in ((mesh, "mesh"), (switch, "switch")):
        r = estimate_plan(p)
        assert r["hardware"]["intra_node_topology"] == topology
        line = training_report(r).splitlines()[1]
        assert ("4 per node, each pair linked directly;" in line) == (topology == "mesh")
    with pytest.raises(
        ConfigError, match="intra_node_topology' got 'ring', expected 'auto' | 'switch' | 'mesh'"
    ):
        parse_args(["--estimate.intra_node_topology=ring"])
