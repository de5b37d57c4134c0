"""Time of one NCCL collective by message size, rank count and topology (docs/estimate.md, "Collectives").

NCCL runs all-gather, reduce-scatter and (without NVLink SHARP) all-reduce as rings, so a collective over n ranks
spread over `nodes` nodes takes

    t = alpha + bytes * (n - 1) / n / busbw            (all-reduce: twice the steps and twice the bytes)

alpha  NCCL's own latency model for the ring with the Simple protocol (the one used for large messages):
       a base latency plus one hop latency per ring step, NVLink (or PCIe) for the steps inside a node and network
       for the (nodes - 1) steps between nodes. Figures: NVIDIA/nccl src/graph/tuning.cc as shipped in NCCL
       2.21.5 (the version in torch 2.5/2.6 CUDA wheels; the `baseLat` / `hwLat` tables, unchanged in these
       entries since 2.18.1): ring Simple base 8.4 us; per step NVLink 3.4 us, PCIe 5.7 us, network 14.0 us
       (the 2020 tables, commit 01afd20, had 9.6 us for the network step).
busbw  the bus bandwidth nccl-tests reports for large messages.
       inside a node: a fraction of the per-direction link rate, Efficiency.intra_node (0.80). NVIDIA's NCCL
         maintainers: on 8 H100 SXM "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an
         effective NVLink bandwidth of 370GB/s ... BusBw when running non-allreduce operations"
         (NVIDIA/nccl-tests#212, 2024-05) and "360 GB/s is exactly what we'd expect on H100" for all_gather_perf
         (NVIDIA/nccl-tests#326, 2025-06): 360/450 = 0.80. A100: NCCL's tuning model caps the ring's busbw of
         compute capability 8.0 at 235 GB/s (tuning.cc above), 0.78 of NVLink 3's 300.
       across nodes: NCCL builds one ring per NIC (rail-optimised servers: one NIC per GPU), so every ring crosses
         each node boundary once and the node's NICs carry the rings side by side: busbw = (ranks of the group on
         one node) x (one NIC's rate x Efficiency.inter_node), never above the intra-node figure. NVIDIA measures
         "192GB/s AllReduce BusBW" on DGX A100 with 8x200 Gb/s InfiniBand (NVIDIA/nccl#812, 2023-03), 0.96 of
         8 x 25 GB/s; ConnectX-7 NICs at NDR "should achieve up to 48-49GB/s per NIC" (NVIDIA/nccl-tests#267,
         2024-11), 0.97 of 50: Efficiency.inter_node = 0.96. A fabric measured below that (--estimate.
         inter_node_busbw_gbps, nccl-tests' busbw over the job's nodes) stands in for the rail figure: each GPU's
         share of it is its rate (steptime.Rates), so a ring holding whole nodes runs at the measured busbw.
A point-to-point send (pipeline stages) uses one link: NVLink inside a node (on a switchless mesh, below, only the
links to that peer: 1 / (GPUs per node - 1) of the GPU's), the sending GPU's NIC across nodes.
Overlap is not free: each NCCL channel is one resident thread block, and with NCCL's shared-memory buffers it keeps
a GEMM tile off its SM, so compute overlapped with a collective runs on (SMs - channels) of the SMs. Channels as
NCCL's logs show them for rings at full NVLink speed: 24 on an HGX A100 node (NVIDIA/nccl-tests#100: "Channel
23/24"), 16 on H100 nodes (NVIDIA/nccl#1453: "Channel 05/16"); 16 elsewhere (an assumption). A ring across nodes
whose group holds every GPU of each node (one NIC per GPU) keeps the node's channels: NCCL 2.21.5's ring search
and channel duplication (src/graph/search.cc, connect.cc) give a multi-node 8-NIC H100 job the same 16 channels
as one node (A100's 24 by the same rule: an extrapolation). A ring with fewer of the group's ranks per node
than GPUs (e.g. FSDP across nodes under TP 8) runs on fewer NICs; NCCL sizes its channels to its bandwidth
(busBw = nChannels x per-channel speed, tuning.cc), so it holds the ring's share of the intra-node bus
bandwidth's channels.
Overlap costs bandwidth too: the ring's own traffic through the GPU's memory (RING_HBM_BYTES_PER_BUS_BYTE per byte on
the bus) leaves memory-bound compute beside it a share c = 3 x busbw / HBM bandwidth less, so a bandwidth-bound
kernel takes 1 / (1 - c) of its time (0.32 of an H100's 3,350 GB/s at 360 GB/s: 1.48x). Checked on the H200 traces
of docs/performance.md command f, where the fake backend's all-gather copies took 0.36 of the bandwidth: the
element-wise kernels beside them ran 1.65x (predicted 1.56x) and the GEMMs 1.00x. `overlap_hbm_share` gives c;
steptime.fsdp_units stretches the memory-bound part of the compute beside an FSDP collective by it, in place of
the SMs' share (a bandwidth-bound kernel does not need every SM).
Switchless meshes (AMD MI300X: Infinity Fabric links of 64 GB/s each way to each of the 7 peers of an 8-GPU node, no
switch; the MI355X's of 76.8) differ: a ring over n ranks of one node has only the (n - 1) links among them, so its
bus bandwidth is (n - 1) / (GPUs per node - 1) of the whole node's. stas00/ml-engineering network/README.md (commit
744d01e) measured all-reduce bus bandwidth with a 4 GiB payload on an 8 x MI300X node: 312.912 GB/s on 8 GPUs,
47.671 on 2 ("2 GPUs performed 6.5x slower than 8"). The 8-GPU figure sets the MI300X fraction of the datasheet
bandwidth, 312.912 / 448 = 0.70 (in place of Efficiency.intra_node); the link rule then gives 44.7 GB/s on 2 GPUs
(measured 47.7). A node of 4 Hopper GPUs without NVSwitch is the same kind of mesh: 6 of each GPU's 18 NVLinks go to
each of its 3 peers. The quad-GH200 node: "GPU All2all: 3x6 NVLink 150GB/s per direction" (CSCS's Alps schematic);
4 H200 NVL joined by NVLink bridges: `nvidia-smi topo -m` NV6 between every pair, and on 2 of them a 1 GB NCCL
collective at 109.4 GB/s and a P2P copy at 133.3 (a public validation log, "2x NVIDIA H200 NVL", driver 580.105.08),
where the rule gives 0.80 x 450 / 3 = 120. The GH200's node is a mesh by default, and so is a node of 4 Hopper SXM
GPUs (`--estimate.devices_per_node=4`: an HGX H100 / H200 4-GPU board; the part alone does not say which board it sits
on); other 4-way NVLink meshes (4-way H200 NVL) with `--estimate.intra_node_topology=mesh`.
Hopper's GEMMs lose more than their share of SMs beside a collective: cuBLAS launches them as persistent kernels,
one CTA per SM (132 on an H100), with the output tiles divided among the CTAs at launch. pytorch/pytorch#143988
(2024-12, FSDP on H100s): "the matmuls take 2x as long to complete when they are overlapped with a NCCL kernel",
the NCCL kernel's CTAs (about a tenth of the SMs) splitting each 132-CTA matmul into two waves; torch added
`torch._C._set_sm_carveout_experimental` for it (pytorch/pytorch#144974, relanded as #147966: "this wave
quantization can double the latency of the matmul kernels"), off unless set (neither torchtitan nor this trainer
sets it). CUTLASS's documentation of Blackwell's Cluster Launch Control (docs.nvidia.com/cutlass) names the flaw of
that static schedule (imbalance when another kernel holds SMs) and Blackwell's hardware work-stealing as its remedy.
So a GEMM launched while a collective still runs for R seconds ends min(R, W) after its standalone time W: its
displaced CTAs start when the collective frees their SMs or when the first CTAs finish, whichever is first.
`overlap_extension` plays this out over a unit's compute taken as equal GEMMs (the unit's matmul time / its GEMM
launches) each after its share of other kernels, which run on the SMs left (the channel share above). No constant
is chosen: the GEMM time and count come from the unit's own pricing. Devices: the Hopper parts
(STATIC_PERSISTENT_GEMM_DEVICES); A100 (Ampere's cuBLAS kernels launch one CTA per tile) and B200 (Cluster Launch
Control) keep the channel share. Adopted in session 19 after the figures of the twelfth out-of-sample pass, which
came after the rule was written, tested it (docs/estimate_log.md, "The persistent-GEMM reading, adopted").
On CPU (gloo, calibrated rates) there is no latency model: the calibration measured the whole collective, each kind
alone at two sizes where it could (`measured_time`: linear in bytes through the two, the bandwidth part scaled by
(n - 1) / n for another group size), else all-gather + reduce-scatter at one size as a bus bandwidth.
Not modelled: NCCL's tree all-reduce (chosen for small messages over many nodes: log2(nodes) network steps instead
of nodes - 1; the ring is an upper bound there) and NVLink SHARP / IB SHARP all-reduce.
"""

from __future__ import annotations

import math

from torchtitan.metrics.hardware import device_spec

from . import rates
from .plan import Plan

RING_BASE_LAT_S = 8.4e-6
HOP_LAT_S = {"nvlink": 3.4e-6, "pci": 5.7e-6, "net": 14.0e-6}  # NCCL 2.21.5 tuning.cc
NVLINK_MIN_GBPS = 100.0  # an intra-node link this fast per direction is NVLink / Infinity Fabric, not PCIe
# Blackwell (NVLink 5, 18 links a GPU): 32 on a DGX B200 node (NVIDIA/nccl#1646, NCCL 2.25.1 under torch 2.8: "Channel
# 04/32", trees [0] .. [31]); the GB200, B300 and GB300 have the same links and bandwidth, so the same count (NCCL
# sizes its channels to the bandwidth, node_channels; an NVIDIA engineer in NVIDIA/nccl#1429: on multi-node NVLink
# systems "there is no difference in the number of channels used").
NCCL_CHANNELS = {"A100": 24, "A100 40GB": 24, **{d: 32 for d in rates.BLACKWELL_DEVICES}}
NCCL_CHANNELS_DEFAULT = 16
# HBM bytes a ring moves on each rank per byte on the bus: NCCL's Simple protocol over NVLink receives into a FIFO in
# the receiver's memory (a write), reads it back (a read) and writes it to the user's buffer (all-gather) or reduces
# it with the local chunk and sends it on (reduce-scatter: a read of the local input); an NCCL maintainer
# (NVIDIA/nccl#1428, 2024): "needs to be multiplied by at least 2x for memory bandwidth, as we need to store to
# memory, then read back from it. If you add reading from or writing to user data, it can be 3x". 3: a ring's
# collectives read or write user data at every step.
RING_HBM_BYTES_PER_BUS_BYTE = 3.0
# Devices whose GEMMs are static persistent kernels (one CTA per SM, tiles assigned at launch): Hopper.
STATIC_PERSISTENT_GEMM_DEVICES = frozenset({"H100 SXM", "H100 NVL", "H100 PCIe", "H200", "H200 NVL"})
# Devices whose node is a switchless full mesh (each GPU linked straight to each peer, no switch): AMD's 8-GPU
# Infinity Fabric nodes and the quad-GH200 nodes (6 NVLinks between every pair; torchtitan/metrics/hardware.py). A
# ring over some of a node's GPUs has only the links among them. A silicon twin's node is its twin's unless named.
# `--estimate.intra_node_topology` overrides it either way (a 4-GPU HGX H100 / H200 board: mesh).
MESH_NODES = frozenset({"MI300X", "MI355X", "GH200", "GH200 144GB"})
# Hopper SXM GPUs come on 8-GPU boards behind NVSwitch or on 4-GPU boards without it (HGX H100 / H200 4-GPU: 6 of each
# GPU's 18 NVLinks to each peer): a node of 4 of them (`--estimate.devices_per_node=4`, the devices sharing a node's
# fabric) is such a board, a mesh under auto.
HOPPER_SXM = frozenset({"H100 SXM", "H200"})
HOPPER_SXM_MESH_NODE = 4
# The measured ring bus bandwidth of a whole node as a fraction of the datasheet per-device figure, where one was
# found (elsewhere Efficiency.intra_node, 0.80, NVIDIA's figure for NVLink 3 and 4).
# NVLink 5 (B200, GB200, B300, GB300; 900 GB/s each way): nccl-tests all_reduce_perf on 8 B200 (AWS p6-b200.48xlarge,
# NCCL 2.27.7, 8 GiB, NCCL_NVLS_ENABLE=0: the ring this model prices), 682.2 GB/s bus bandwidth, 0.758 of 900
# (stas00/ml-engineering 744d01e network/README.md; 838.0 with NVLink SHARP, which the trainer's collectives do not
# request); NVIDIA's GTC 2025 slide in the same file puts 8 B200 at 700 and a GB200 NVL72 ring over 32 GPUs at 680.
# Mesh nodes: MI300X (448 GB/s = 7 x 64): stas00/ml-engineering, 312.912 GB/s all-reduce busbw, 4 GiB. No NCCL
# figure of a quad-GH200 node alone was found (CSCS's and Sigma2's nccl-tests span two nodes, bound by the NICs): it
# takes the NVLink fraction (efficiency.intra_node).
# The MI355X's mesh (7 x 76.8 GB/s each way) takes the MI300X's fraction: no RCCL bus bandwidth of a whole MI355X node
# at a large payload was found (ROCm/mori#200's 326 / 333 GB/s reduce-scatter / all-gather at 128 MB a GPU do not
# say whether they are bus or algorithm bandwidth; 0.70 x 537.6 = 376).
NVLINK5_RING_BUSBW = 682.2
RING_BUSBW_FRACTION = {
    "MI300X": 312.912 / 448.0,
    "MI355X": 312.912 / 448.0,
    **{d: NVLINK5_RING_BUSBW / 900.0 for d in rates.BLACKWELL_DEVICES},
}


def intra_fraction(device: str, default: float) -> float:
    """Sustained fraction of the intra-node datasheet bandwidth a ring over a whole node reaches on this device."""
    return RING_BUSBW_FRACTION.get(rates.silicon(device), default)


def is_mesh(plan: Plan) -> bool:
    """Whether the plan's node links each GPU straight to each peer (no switch): `--estimate.intra_node_topology`,
    or with auto the device's own node (MESH_NODES) or a 4-GPU node of Hopper SXM GPUs (HOPPER_SXM)."""
    topology = plan.cfg.estimate.intra_node_topology
    if topology != "auto":
        return topology == "mesh"
    name = plan.hw.name
    if name in MESH_NODES or rates.silicon(name) in MESH_NODES:
        return True
    return rates.silicon(name) in HOPPER_SXM and plan.hw.devices_per_node == HOPPER_SXM_MESH_NODE


def intra_busbw(plan: Plan, intra: float, ppn: int) -> float:
    """Bus bandwidth inside a node for a ring with `ppn` of its ranks on each node: the node figure behind a switch
    (NVSwitch), (ppn - 1) / (GPUs per node - 1) of it on a switchless mesh (its links among those ranks only)."""
    dpn = plan.hw.devices_per_node
    if is_mesh(plan) and 1 < ppn < dpn:
        return intra * (ppn - 1) / (dpn - 1)
    return intra


def overlap_sm_share(plan: Plan, ring_busbw: float, intra: float, full_nodes: bool = False) -> float:
    """Share of the SMs a ring running at `ring_busbw` takes from the compute it overlaps (0 on CPU).
    `full_nodes`: the ring's group holds every GPU of each node it spans (NCCL keeps the node's channels)."""
    if plan.hw.is_cpu:
        return 0.0
    try:
        sms = rates.gemm_source(plan.hw.name)[0].sms
    except KeyError:
        return 0.0
    share = 1.0 if full_nodes else min(1.0, ring_busbw / intra)
    return min(1.0, node_channels(plan.hw.name) * share / sms)


def overlap_hbm_share(plan: Plan, ring_busbw: float) -> float:
    """Share of the device's memory bandwidth a ring running at `ring_busbw` takes from the compute it overlaps (0 on
    CPU): RING_HBM_BYTES_PER_BUS_BYTE bytes of HBM traffic for each byte on the bus."""
    if plan.hw.is_cpu:
        return 0.0
    return min(0.9, RING_HBM_BYTES_PER_BUS_BYTE * ring_busbw / (plan.hw.hbm_gbps * 1e9))


def node_channels(device: str) -> float:
    """NCCL channels of a ring at a node's full bus bandwidth. A silicon twin with slower links (rates.SILICON_TWINS:
    the H800's and A800's NVLink at 200 GB/s each way) has its twin's channels times the links' ratio: NCCL sizes
    its channels to the bandwidth (busBw = nChannels x per-channel speed, tuning.cc), the rule a ring on fewer NICs
    follows above."""
    twin = rates.silicon(device)
    channels = NCCL_CHANNELS.get(twin, NCCL_CHANNELS_DEFAULT)
    if twin != device:
        channels *= device_spec(device).intra_node_gbps / device_spec(twin).intra_node_gbps
    return channels


def overlap_extension(
    comm: float, compute: float, sm_share: float, gemm_share: float = 0.0, gemm_s: float = 0.0
) -> float:
    """Seconds a collective of `comm` seconds and `compute` seconds of compute started beside it take together beyond
    the compute alone; the pair ends when both have ended.

    `sm_share`: the share of the SMs the collective's channels hold (non-GEMM kernels run on the rest). `gemm_share`,
    `gemm_s`: on a device with static persistent GEMMs, the GEMMs' share of the compute and the mean duration of one
    GEMM; a GEMM launched while the collective has R seconds left ends min(R, W) late. 0: every kernel just loses
    `sm_share` of its rate.
    """
    if comm <= 0.0:
        return 0.0
    if gemm_share <= 0.0 or gemm_s <= 0.0 or sm_share <= 0.0:
        return max(comm - compute, sm_share * min(comm, compute))
    w = gemm_s
    o = w * (1.0 - gemm_share) / gemm_share  # other kernels' seconds before each GEMM
    stretch = 1.0 / (1.0 - sm_share) if sm_share < 1.0 else math.inf
    # The collective's CTAs get SMs at the end of a GEMM (it holds them all) or during other kernels; the mean over
    # where it starts: after a GEMM (weight gemm_share), or at an even spread of points inside the other kernels.
    starts = [(o, gemm_share)] + [
        (o * (i + 0.5) / PHASES, (1.0 - gemm_share) / PHASES) for i in range(PHASES)
    ]
    return sum(p * _played_out(comm, compute, o, w, stretch, first) for first, p in starts)


PHASES = 4  # start points inside the other kernels averaged over (overlap_extension)


def _played_out(comm: float, compute: float, o: float, w: float, stretch: float, first: float) -> float:
    """overlap_extension for a compute stream of `first` seconds of other kernels, then GEMMs of `w` seconds each
    after `o` seconds of other kernels, beside a collective of `comm` seconds started with it."""
    lead = min(first, compute)  # the first other kernels, slowed while the collective runs
    wall, done = (lead * stretch if lead * stretch <= comm else comm + (lead - comm / stretch)), lead
    # whole periods (a GEMM at twice its time, then other kernels) that end before the collective does
    period = 2.0 * w + o * stretch
    if done < compute and wall < comm:
        n = max(0, min(math.floor((comm - wall) / period), math.floor((compute - done) / (o + w))))
        wall, done = wall + n * period, done + n * (o + w)
    while wall < comm and done < compute:
        g = min(w, compute - done)  # one GEMM: its displaced CTAs wait min(R, W)
        wall += g + min(comm - wall, g)
        done += g
        if done >= compute:
            break
        left = min(o, compute - done)  # other kernels, slowed while the collective runs
        r = comm - wall
        wall += left * stretch if left * stretch <= r else max(r, 0.0) + (left - max(r, 0.0) / stretch)
        done += left
    return max(wall + (compute - done), comm) - compute


def group_layout(plan: Plan, n: int, stride: int) -> tuple[int, int]:
    """(ranks per node, nodes) of a group of n ranks whose members are `stride` global ranks apart."""
    per_node = plan.hw.devices_per_node
    ppn = max(1, min(n, per_node // max(1, stride)))
    return ppn, math.ceil(n / ppn)


def busbw(plan: Plan, intra: float, inter: float, n: int, stride: int) -> float:
    """Bytes/s of bus bandwidth of a ring over this group."""
    ppn, nodes = group_layout(plan, n, stride)
    node_bw = intra_busbw(plan, intra, ppn)
    if nodes == 1:
        return node_bw
    return min(node_bw, ppn * inter) if ppn > 1 else inter


def ring_latency(plan: Plan, n: int, stride: int, steps_per_rank: int = 1) -> float:
    """Seconds of NCCL's ring latency for a collective of `steps_per_rank` x (n - 1) steps."""
    if plan.hw.is_cpu or n <= 1:
        return 0.0
    _, nodes = group_layout(plan, n, stride)
    hop = HOP_LAT_S["nvlink"] if plan.hw.intra_node_gbps >= NVLINK_MIN_GBPS else HOP_LAT_S["pci"]
    inter_steps = nodes - 1
    return RING_BASE_LAT_S + steps_per_rank * ((n - 1 - inter_steps) * hop + inter_steps * HOP_LAT_S["net"])


def measured_time(points: list, kind: str, nbytes: float, n: int) -> float | None:
    """Seconds of one `kind` collective of `nbytes` over n ranks from a CPU calibration's measurements of it
    ([kind, processes, bytes, seconds] at two sizes): the line through the two (a fixed cost per call plus a cost
    per byte, neither below zero), the per-byte part scaled by (n - 1) / n against the measured group's. None
    without two measurements of that kind."""
    got = sorted((b, s, w) for k, w, b, s in points if k == kind)
    if len(got) < 2 or got[0][0] == got[-1][0]:
        return None
    (b0, t0, w), (b1, t1, _) = got[0], got[-1]
    per_byte = max(0.0, (t1 - t0) / (b1 - b0))
    fixed = max(0.0, t0 - per_byte * b0)
    return fixed + per_byte * nbytes * ((n - 1) / n) / ((w - 1) / w)


def ring_time(plan: Plan, intra: float, inter: float, nbytes: float, n: int, stride: int, kind: str) -> float:
    """Seconds of an all-gather / reduce-scatter (`nbytes`: the full gathered or reduced buffer of one rank) or
    all-reduce (`nbytes`: the buffer) over n ranks `stride` global ranks apart."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if plan.hw.is_cpu and plan.calibration is not None:
        t = measured_time(plan.calibration.collective_s, kind, nbytes, n)
        if t is not None:
            return t
    factor = 2 if kind == "all_reduce" else 1
    bw = busbw(plan, intra, inter, n, stride)
    return ring_latency(plan, n, stride, factor) + factor * nbytes * (n - 1) / n / bw


def p2p_time(plan: Plan, intra: float, inter: float, nbytes: float, distance: int) -> float:
    """Seconds of one send of `nbytes` to the rank `distance` global ranks away."""
    if nbytes <= 0:
        return 0.0
    same_node = distance < plan.hw.devices_per_node
    lat = 0.0 if plan.hw.is_cpu else RING_BASE_LAT_S + HOP_LAT_S["nvlink" if same_node else "net"]
    # inside a node a send has the links of a pair (on a mesh, only those to that peer)
    return lat + nbytes / (intra_busbw(plan, intra, 2) if same_node else inter)
