"""Peak FLOPS of the device: the denominator of MFU.

One table of datasheet peaks, shared by the live metrics and by the estimator, so the two never disagree.
Rules that keep MFU honest:
  * the table holds DENSE peaks. NVIDIA datasheets headline the 2:4-sparse figure (marked "*" there);
    training matmuls are dense, so every sparse number is halved here.
  * a device name is mapped to a table entry only when it matches a known pattern exactly; anything else
    (a new GPU, a MIG slice, a cut-down export part) is NOT treated as the nearest known device. It is
    measured with a short matmul calibration, and the run header says so. `metrics.peak_tflops` overrides all.
"""

import math
import platform
import re
import time
from dataclasses import dataclass

import torch

from torchtitan.errors import UserError


@dataclass(frozen=True)
class DeviceSpec:
    name: str  # canonical key, e.g. "H100 SXM"
    bf16_tflops: float | None  # dense BF16 tensor-core peak, one device; None: measured (CPU)
    fp8_tflops: float | None  # dense FP8 peak; None: the device has no FP8 matmul
    memory_gib: float | None  # HBM per device as sold for training (the estimator's budget); None: system RAM
    # For the estimator (torchtitan/estimate): bandwidths in GB/s (1e9 bytes/s), datasheet peaks, one direction.
    hbm_gbps: float | None = None  # device memory bandwidth; None: measured
    intra_node_gbps: float | None = None  # per device to its node peers (NVLink / Infinity Fabric / PCIe)
    inter_node_gbps: float | None = None  # per device across nodes (the NIC(s) serving one device)
    devices_per_node: int = 8  # devices sharing the intra-node fabric in a typical server


# Sources (dense = sparse / 2 wherever the datasheet lists the sparse figure; bandwidths are datasheet peaks,
# per device and per direction: NVLink "900 GB/s" is the bidirectional total, so 450 each way):
#   A100:      NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TF (624 sparse), no FP8. 40 GB and 80 GB parts
#              have the same peak; 80 GB is listed as the memory ("A100 40GB" below is the 40 GB part).
#              HBM2e 2,039 GB/s (80 GB SXM), 1,555 GB/s (40 GB); NVLink 3: 600 GB/s -> 300; inter-node: DGX A100
#              has one 200 Gb/s HDR InfiniBand port per GPU -> 25 GB/s.
#   H100 SXM:  NVIDIA H100 datasheet, SXM column: BF16 1,979* TF, FP8 3,958* TF (* = with sparsity), 80 GB,
#              HBM3 3.35 TB/s, NVLink 4 900 GB/s -> 450; DGX H100: one 400 Gb/s NDR port per GPU -> 50 GB/s.
#   H100 NVL:  same datasheet, NVL column: BF16 1,671*, FP8 3,341*, 94 GB, 3.9 TB/s; NVLink bridges join pairs
#              only, so collectives over a node of 8 cross PCIe Gen5 x16 (64 GB/s); 200 Gb/s per GPU assumed.
#   H100 PCIe: same datasheet, PCIe column: BF16 1,513*, FP8 3,026*, 80 GB, 2.0 TB/s, PCIe Gen5 64 GB/s,
#              200 Gb/s per GPU assumed.
#   H200:      NVIDIA H200 datasheet, SXM column: BF16 1,979*, FP8 3,958*, 141 GB, 4.8 TB/s (same compute as H100
#              SXM), NVLink 900 GB/s -> 450; HGX H200 systems: 400 Gb/s per GPU -> 50 GB/s.
#   H200 NVL:  same datasheet, NVL column: BF16 1,671*, FP8 3,341*, 141 GB, 4.8 TB/s. It is a lower-power PCIe
#              card with the H100 NVL's compute, so it gets its own entry: mapping it to "H200" would overstate the
#              peak by 18% and understate MFU. NVLink bridges join 2 or 4 cards; 8-card collectives use PCIe
#              Gen5 (64 GB/s); 200 Gb/s per GPU assumed.
#   L40S:      NVIDIA L40S datasheet: BF16 362.05 TF (733* sparse), FP8 733 TF (1,466* sparse), 48 GB GDDR6
#              864 GB/s, no NVLink: PCIe Gen4 x16 (32 GB/s); 200 Gb/s per GPU assumed.
#   B200:      NVIDIA HGX B200 datasheet: 8 GPUs give FP16/BF16 36 PF* and FP8 72 PF* -> per GPU dense
#              2.25 PF BF16 and 4.5 PF FP8; 180 GB HBM3e per GPU; NVLink 5 1.8 TB/s -> 900; 400 Gb/s ConnectX-7
#              per GPU -> 50 GB/s. Memory bandwidth: the datasheet's 8 TB/s (64 TB/s for 8) counts an 8,192-bit
#              bus, but a B200's driver reports 7,680 bits at 3,996 MHz (cudaGetDeviceProperties and nvidia-smi in
#              pytorch/ao#4002, 2026-03-05, which corrected torchao's roofline to it): 7,680 / 8 x 3,996 x 2 =
#              7,672 GB/s: 15/16 of the 8 stacks' bus, as the capacity is 15/16 of their 192 GB.
#   GB200:     NVIDIA GB200 NVL72 (nvidia.com/en-us/data-center/gb200-nvl72; the DGX GB200 page gives the same):
#              72 GPUs give FP16/BF16 360 PF* and FP8 720 PF* -> per GPU dense 2.5 PF BF16 and 5 PF FP8 (the
#              Blackwell datasheet's GB200 configuration, 1,200 W, against the HGX B200's 1,000 W); 13.4 TB and
#              576 TB/s HBM3e -> 186 GB and 8 TB/s per GPU; the table takes the bandwidth the driver gives, as
#              for the B200 above: torch's own device limits on a GB200 print 7,928.064 GB/s
#              (pytorch/pytorch#172523, 2026-01-15), a 7,936-bit bus at 3,996 MHz, 31/32 of the 8 stacks' bus as
#              186 GB is 31/32 of their 192: 7,928 GB/s. NVLink 5 1.8 TB/s -> 900, and the NVLink domain is the
#              whole rack: 72 GPUs share the switch fabric (devices_per_node = 72, the estimator's "node" being the
#              NVLink domain; a GB200 NVL4 board or a job split over racks: --estimate.devices_per_node); 400 Gb/s
#              per GPU between racks (ConnectX-7, as on the HGX B200; assumed) -> 50 GB/s. torch names the part
#              "NVIDIA GB200" (compute capability 10.0).
#   B300:      NVIDIA HGX B300 (Blackwell Ultra; nvidia.com/en-us/data-center/hgx, and Verda's per-GPU table of
#              NVIDIA's figures, "NVIDIA GB300 NVL72: GPU Architecture & Performance", 2025): 8 GPUs give FP16/BF16
#              36 PF* and FP8 72 PF* -> per GPU dense 2.25 PF BF16 and 4.5 PF FP8 (the B200's; Blackwell Ultra raises
#              NVFP4 and the SFUs' exponentials, not these); 288 GB HBM3e physical, 270 GB per GPU as NVIDIA lists it
#              (nvidia-smi reports 275,040 MiB, 268.6 GiB), 8 TB/s; NVLink 5 1.8 TB/s -> 900; one 800 Gb/s
#              ConnectX-8 per GPU -> 100 GB/s; 1,100 W. torch names it "NVIDIA B300 SXM6 AC" (compute capability
#              10.3, 148 SMs).
#   GB300:     NVIDIA GB300 NVL72 (nvidia.com/en-us/data-center/gb300-nvl72): FP8 360 PF dense for 72 GPUs -> 5 PF FP8
#              and 2.5 PF BF16 dense per GPU (as the GB200); 20 TB and 576 TB/s HBM3e -> 279 GB and 8 TB/s per GPU;
#              NVLink 5 900 each way, the NVLink domain the whole rack (devices_per_node = 72, as for the GB200); one
#              800 Gb/s ConnectX-8 per GPU between racks -> 100 GB/s; 1,400 W. torch names it "NVIDIA GB300".
#   MI300X:    AMD Instinct MI300X datasheet: BF16 1,307.4 TF dense, FP8 2,614.9 TF dense, 192 GB HBM3
#              5.3 TB/s; Infinity Fabric: 7 links x 64 GB/s each way to the 7 peers of an 8-GPU node -> 448;
#              400 Gb/s per GPU -> 50 GB/s.
#   H800:      NVIDIA H800 SXM5 (the H100 SXM's GH100 die for markets under export rules: its BF16 / FP8 tensor
#              cores, 80 GB HBM3 at 3.35 TB/s; deepseek-ai/FlashMLA's kernel deep dive: "An NVIDIA H800 SXM5 GPU has a
#              peak memory bandwidth of 3.35 TB/s and peak FLOPs of 990 TFlops"; 700 W assumed, the H100 SXM's).
#              NVLink cut to 400 GB/s -> 200 each way: DeepSeek's ISCA 2025 paper (arXiv 2505.09343): "the NVLink
#              bandwidth in H800 SXM nodes is reduced from 900 GB/s to 400 GB/s", with "eight 400G Infiniband (IB)
#              CX7 NICs" a node -> 50 GB/s; the DeepSeek-V3 report's "NVLink offers a bandwidth of 160 GB/s, roughly
#              3.2 times that of IB (50 GB/s)" is their one-way measurement (deepseek-ai/DeepSeek-V3#28: 400 GB/s is
#              the two-way theoretical figure, 160 GB/s their measured one-way): 0.80 of 200, the estimator's
#              intra-node fraction. torch names it "NVIDIA H800" or "NVIDIA H800 80GB HBM3"; the PCIe card
#              "NVIDIA H800 PCIe" (2.0 TB/s) is another part, left unmatched.
#   A800:      NVIDIA A800 SXM4 80GB (the A100's GA100 die for the same markets, announced by NVIDIA in November
#              2022 with NVLink cut from 600 to 400 GB/s -> 200 each way, compute unchanged: the A100 SXM4 80GB's BF16
#              312 TF dense, 80 GB HBM2e 2,039 GB/s, 400 W); one 200 Gb/s HDR port per GPU assumed, as for the A100
#              -> 25 GB/s. torch names it "NVIDIA A800-SXM4-80GB".
#   GH200:     NVIDIA GH200 Grace Hopper Superchip, its GPU: the H100 SXM's GH100 die beside a Grace CPU (132 SMs:
#              JSC's JUPITER configuration page, apps.fz-juelich.de/jsc/hps/jupiter/configuration.html; BF16 989 and
#              FP8 1,979 TF dense, "per chip w/o sparsity", stas00/ml-engineering 744d01e
#              compute/accelerator/README.md). Two memory variants: 96 GB HBM3 at 4 TB/s (JSC's page: "96 GB HBM3
#              memory at 4 TB/s"; CSCS's Alps node schematic, eth-cscs/cscs-docs 80abed13
#              docs/images/alps/gh200-schematic.svg: "<=4000GB/s"), which torch names "NVIDIA GH200 480GB" or
#              "NVIDIA GH200 120GB" (the superchip's LPDDR5X; nvidia-smi 97,871 MiB), and "GH200 144GB" below. The
#              HPC systems built from it (CSCS Alps, JSC JUPITER, Bristol Isambard-AI, Sigma2 Olivia) have 4 GH200 a
#              node, every pair joined by 6 NVLink 4 links: "GPU All2all: 3x6 NVLink 150GB/s per direction" (the Alps
#              schematic), "150 GB/s per direction" between pairs (JSC) -> 3 x 150 = 450 each way, a switchless full
#              mesh (the estimator's collectives.MESH_NODES); one 200 Gb/s NIC per GH200 (Alps: "Slingshot
#              hsn0-hsn3 200Gb/s (25GB/s)"; JUPITER: "4x InfiniBand NDR200") -> 25 GB/s. Power is the module's (CPU +
#              GPU + memory), capped by the site: Alps "approximately 660 W" (cscs-docs docs/running/slurm.md),
#              JUPITER "TDP: 680 W (for full GH200 superchip)"; nvidia-smi shows the GPU's own limit as 900 W. A
#              single-GH200 node (Lambda's, Durham's Bede) or a DGX GH200 has other links: --estimate.devices_per_node
#              and the bandwidth overrides.
#   GH200 144GB: the same superchip with 144 GB HBM3e (nvidia-smi 146,831 MiB) at 4.9 TB/s, NVIDIA's figure as
#              commonly quoted (its page was not read here); the part's own CUDA device attributes (a driver 13.2
#              snapshot of a "NVIDIA GH200 144G HBM3e" found in a public repository: memory clock 3,201,000 kHz on a
#              6,144-bit bus, 132 SMs at 1,980 MHz) give 2 x 3.201e9 x 6144 / 8 = 4.92 TB/s, the formula that gives
#              the H100 SXM's 3.35 from its 2,619 MHz and 5,120 bits. torch names it "NVIDIA GH200 144G HBM3e" (also
#              seen as "NVIDIA GH200 144GB HBM3e"); the node as above. A bare "NVIDIA GH200" does not say which
#              memory: unmatched.
#   MI325X:    AMD Instinct MI325X (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): the MI300X's CDNA 3
#              compute (BF16 1,307.4 TF dense, FP8 2,614.9) and its 7-link Infinity Fabric mesh (448 each way),
#              with 256 GB HBM3E at 6 TB/s and a 1,000 W board power (stas00/ml-engineering, commit 744d01e:
#              "MI325X is the same compute as MI300X, but has more memory and more power"); 400 Gb/s per GPU
#              assumed -> 50 GB/s. torch names it "AMD Instinct MI325X".
#   MI355X:    AMD Instinct MI355X (CDNA 4; amd.com/en/products/accelerators/instinct/mi350/mi355x.html): BF16 2.5 PF
#              and OCP-FP8 5.0 PF dense (2,516.6 / 5,033.2 TF: 2,400 MHz x 1,024 matrix cores x 512 / 1,024 FMAs;
#              10.1 PF is the sparse FP8 figure), 288 GB HBM3E 8 TB/s; Infinity Fabric: 7 links of 153.6 GB/s
#              (1,075.2 GB/s peer-to-peer), 76.8 each way to each of the 7 peers of an 8-GPU node -> 537.6; 400 Gb/s
#              per GPU assumed -> 50 GB/s; 1,400 W. torch names it "AMD Instinct MI355X".
# Hopper's FP8 is exactly twice its BF16 (the project's convention rounds H100 SXM to 989), so the Hopper
# FP8 figures are written as 2x.
DEVICE_SPECS: dict[str, DeviceSpec] = {
    s.name: s
    for s in [
        DeviceSpec("A100", 312.0, None, 80.0, 2039.0, 300.0, 25.0),
        DeviceSpec("H100 SXM", 989.0, 2 * 989.0, 80.0, 3350.0, 450.0, 50.0),
        DeviceSpec("H100 NVL", 835.0, 2 * 835.0, 94.0, 3900.0, 64.0, 25.0),
        DeviceSpec("H100 PCIe", 756.0, 2 * 756.0, 80.0, 2000.0, 64.0, 25.0),
        DeviceSpec("H200", 989.0, 2 * 989.0, 141.0, 4800.0, 450.0, 50.0),
        DeviceSpec("H200 NVL", 835.0, 2 * 835.0, 141.0, 4800.0, 64.0, 25.0),
        DeviceSpec("H800", 989.0, 2 * 989.0, 80.0, 3350.0, 200.0, 50.0),
        DeviceSpec("A800", 312.0, None, 80.0, 2039.0, 200.0, 25.0),
        DeviceSpec("GH200", 989.0, 2 * 989.0, 96.0, 4000.0, 450.0, 25.0, devices_per_node=4),
        DeviceSpec("GH200 144GB", 989.0, 2 * 989.0, 144.0, 4900.0, 450.0, 25.0, devices_per_node=4),
        DeviceSpec("L40S", 362.0, 733.0, 48.0, 864.0, 32.0, 25.0),
        DeviceSpec("B200", 2250.0, 4500.0, 180.0, 7672.0, 900.0, 50.0),
        DeviceSpec("GB200", 2500.0, 5000.0, 186.0, 7928.0, 900.0, 50.0, devices_per_node=72),
        DeviceSpec("B300", 2250.0, 4500.0, 270.0, 8000.0, 900.0, 100.0),
        DeviceSpec("GB300", 2500.0, 5000.0, 279.0, 8000.0, 900.0, 100.0, devices_per_node=72),
        DeviceSpec("MI300X", 1307.0, 2615.0, 192.0, 5300.0, 448.0, 50.0),
        DeviceSpec("MI325X", 1307.0, 2615.0, 256.0, 6000.0, 448.0, 50.0),
        DeviceSpec("MI355X", 2516.6, 5033.2, 288.0, 8000.0, 537.6, 50.0),
    ]
}

# Parts the estimator plans for that a running job never maps to by name: the 40 GB A100 (its name matches
# "A100", whose peak is the same, so MFU is unaffected) and the CPU, whose peak and bandwidths are measured
# (torchtitan.estimate.calibrate) and whose memory is the machine's RAM. Gloo between processes of one host.
ESTIMATOR_SPECS: dict[str, DeviceSpec] = {
    s.name: s
    for s in [
        DeviceSpec("A100 40GB", 312.0, None, 40.0, 1555.0, 300.0, 25.0),
        DeviceSpec("CPU", None, None, None, None, None, None, devices_per_node=1),
    ]
}


# What torch.cuda.get_device_name() returns, matched against the WHOLE (whitespace-normalised, case-folded)
# string. Full matches mean a longer or different name never slips in: "NVIDIA RTX A1000" is not an A100,
# "NVIDIA L40" is not an L40S, "NVIDIA GB300" is not a GB200, "NVIDIA H800" is not an H100, and a MIG slice
# ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") owns only a fraction of the device's SMs, so it is measured instead.
# The vendor prefix is optional for NVIDIA because older drivers report e.g. "A100-SXM4-40GB".
_NV = r"(nvidia )?"
_MEM = r"( \d+gb)?"
_NAME_PATTERNS: list[tuple[str, str]] = [
    (_NV + r"a100([- ](sxm\d?|pcie|\d+gb))*", "A100"),  # A100-SXM4-80GB, A100-PCIE-40GB, A100 80GB PCIe
    (_NV + r"h100 nvl", "H100 NVL"),
    (_NV + r"h100 pcie" + _MEM, "H100 PCIe"),
    # The SXM5 part reports "NVIDIA H100 80GB HBM3": HBM3 is what distinguishes it from the PCIe card
    # (HBM2e). A bare "NVIDIA H100" is ambiguous and therefore left unmatched.
    (_NV + r"h100( sxm\d?)?" + _MEM + r" hbm3", "H100 SXM"),
    (_NV + r"h100 sxm\d?" + _MEM, "H100 SXM"),
    (_NV + r"h200 nvl", "H200 NVL"),
    (_NV + r"h200( sxm\d?)?" + _MEM + r"( hbm3e)?", "H200"),
    # "NVIDIA H800" or "NVIDIA H800 80GB HBM3"; the 2,000 GB/s PCIe card ("NVIDIA H800 PCIe") is left unmatched
    (_NV + r"h800( sxm\d?)?" + _MEM + r"( hbm3)?", "H800"),
    (_NV + r"a800([- ](sxm\d?|\d+gb))*", "A800"),  # A800-SXM4-80GB; the PCIe cards are left unmatched
    # a Grace Hopper superchip's GPU, named by the superchip's LPDDR5X (480 or 120 GB) beside its 96 GB HBM3
    (_NV + r"gh200 (480|120)gb", "GH200"),
    (_NV + r"gh200 144gb? hbm3e", "GH200 144GB"),
    (_NV + r"l40s", "L40S"),
    (_NV + r"b200" + _MEM + r"( hbm3e)?", "B200"),
    (_NV + r"gb200" + _MEM, "GB200"),  # the GPU of a Grace Blackwell superchip: its own peak, not the B200's
    (_NV + r"b300( sxm\d?)?( ac)?" + _MEM + r"( hbm3e)?", "B300"),  # "NVIDIA B300 SXM6 AC"
    (_NV + r"gb300" + _MEM, "GB300"),  # Grace Blackwell Ultra: its own memory and power
    # "VF" is the SR-IOV name cloud VMs see for a whole passed-through MI300X.
    (r"(amd )?(instinct )?mi300x( vf)?", "MI300X"),
    (r"(amd )?(instinct )?mi325x( vf)?", "MI325X"),
    (r"(amd )?(instinct )?mi355x( vf)?", "MI355X"),
]


def match_device(name: str) -> str | None:
    """Canonical DEVICE_SPECS key for a torch.cuda.get_device_name() string, or None if it is not known."""
    norm = " ".join(name.split()).lower()
    for pattern, key in _NAME_PATTERNS:
        if re.fullmatch(pattern, norm):
            return key
    return None


def _slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def device_spec(name: str) -> DeviceSpec:
    """Look up a spec by canonical key ("H100 SXM"), slug ("h100-sxm") or a real device name (estimator CLI)."""
    for key, spec in {**DEVICE_SPECS, **ESTIMATOR_SPECS}.items():
        if name == key or _slug(name) == _slug(key):
            return spec
    key = match_device(name)
    if key is None:
        valid = ", ".join(_slug(k) for k in {**DEVICE_SPECS, **ESTIMATOR_SPECS})
        raise UserError(f"unknown hardware {name!r}: valid names are {valid}")
    if key == "A100" and stated_memory_gb(name) == 40:
        # one peak for MFU, but a 40 GB A100 ("NVIDIA A100-SXM4-40GB", "A100-PCIE-40GB") has half the memory and
        # 1,555 GB/s: the estimator and generation_latency plan for the part the name says
        return ESTIMATOR_SPECS["A100 40GB"]
    return DEVICE_SPECS[key]


def stated_memory_gb(name: str) -> int | None:
    """The device memory a name states ("NVIDIA A100-SXM4-40GB": 40; "gh200-144gb": 144), or None. A GH200's real
    name states its CPU's LPDDR5X ("NVIDIA GH200 480GB", "120GB"), not the GPU's memory: None."""
    stated = re.search(r"(\d+) ?gb", name.lower())
    if stated is None or match_device(name) == "GH200":
        return None
    return int(stated.group(1))


@dataclass
class PeakFlops:
    # bf16_tflops: dense peak for the run's matmul dtype (the table lists BF16; a CPU fp32 run measures fp32)
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 peak known, so no mixed FP8/BF16 MFU can be reported
    source: str  # where the numbers came from, printed in the run header
    device_name: str

    @property
    def measured(self) -> bool:
        """A calibration on this machine (resolve_peak's "measured: ..." source), not a table or override value."""
        return self.source.startswith("measured")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # also ROCm, which presents itself as cuda
        torch.cuda.synchronize(device)
    elif device.type != "cpu":  # xpu, mps, ... expose the same call
        getattr(torch, device.type).synchronize()


def _calibration_size(device: torch.device) -> int:
    # Large enough to reach the tensor cores' steady state, small enough to finish in well under a second:
    # 8192^3 is ~1.1 TFLOP (about 1 ms on an H100); 1024^3 is ~2 GFLOP (a few ms on a CPU core).
    return {"cuda": 8192, "cpu": 1024}.get(device.type, 2048)


def _is_float8(dtype: torch.dtype) -> bool:
    return "float8" in str(dtype)


def calibrate_tflops(
    device: torch.device | str, dtype: torch.dtype, seconds: float = 0.5, size: int | None = None
) -> float:
    """Best observed TFLOPS of a square `size`^3 matmul in `dtype` on `device`, measured for about `seconds`."""
    device = torch.device(device)
    if _is_float8(dtype):  # a plain fp8 `a @ b` does not exist (it needs scaled_mm): measure bf16 instead
        dtype = torch.bfloat16
    n = size or _calibration_size(device)
    # CPU timing is coarse enough per call; on an accelerator one launch is too short to time alone.
    reps = 1 if device.type == "cpu" else 10
    with torch.no_grad():
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        c = torch.empty(n, n, device=device, dtype=dtype)
        # Warm up: the BLAS library picks its kernel and a GPU ramps its clocks before we start timing.
        for _ in range(3):
            torch.mm(a, b, out=c)
        _sync(device)
        best = 0.0
        deadline = time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            _sync(device)
            dt = time.perf_counter() - t0
            best = max(best, 2 * n**3 * reps / dt)  # a matmul is n^3 multiply-adds = 2n^3 FLOPs
            if time.perf_counter() >= deadline:
                break
    return best / 1e12


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_lacks_bf16_instructions() -> bool:
    """True on an x86 CPU without AVX512-BF16 and AMX; False elsewhere (other architectures, whose capability
    torch does not report, and torch builds without the probes)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    checks = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    return None not in checks and not any(check() for check in checks)


def cpu_bf16_warning(device: torch.device | str, dtype: torch.dtype, fp32_kernels: bool) -> str | None:
    """The run-header warning for bf16 compute on an x86 CPU without bf16 instructions (AVX512-BF16 or AMX)
    when the run uses torch's bf16 kernels there (training.cpu_bf16_fp32_kernels=false), which emulate bf16
    matmuls in fp32 arithmetic plus conversions; None otherwise."""
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16 or fp32_kernels:
        return None
    if not cpu_lacks_bf16_instructions():
        return None
    return (
        f"bf16 compute on a CPU without bf16 instructions ({_cpu_name()}: no AVX512-BF16, no AMX) with"
        " training.cpu_bf16_fp32_kernels=false: torch emulates the bf16 matmuls, 2-5x slower than its fp32"
        " kernels here (docs/performance.md)"
    )


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{_cpu_name()} ({torch.get_num_threads()} threads)"
    return device.type


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")


def resolve_peak(
    device: torch.device | str,
    dtype: torch.dtype,
    override_tflops: float | None,
    override_fp8_tflops: float | None = None,
    seconds: float = 0.5,
) -> PeakFlops:
    """The peak MFU is measured against: the override, else the datasheet table (CUDA), else a calibration.

    `dtype` is the matmul dtype of the run; it only matters when measuring. With an override the FP8 peak
    is unknown unless `override_fp8_tflops` is given too (the table's ratio is not assumed to hold for a
    device whose BF16 peak the user had to correct).
    """
    device = torch.device(device)
    name = _device_name(device)
    if override_tflops is not None:
        if not (math.isfinite(override_tflops) and override_tflops > 0):
            raise UserError(f"metrics.peak_tflops = {override_tflops!r}: must be a positive number of TFLOPS")
        return PeakFlops(override_tflops, override_fp8_tflops, "metrics.peak_tflops override", name)
    if device.type == "cuda":
        key = match_device(name)
        if key is not None:
            spec = DEVICE_SPECS[key]
            return PeakFlops(spec.bf16_tflops, spec.fp8_tflops, f"table: {key} (dense bf16)", name)
    if _is_float8(dtype):
        dtype = torch.bfloat16
    n = _calibration_size(device)
    measured = calibrate_tflops(device, dtype, seconds=seconds, size=n)
    source = f"measured: {n}^3 {_dtype_name(dtype)} matmul calibration on {device.type}"
    if device.type != "cpu":
        source += f" ({name!r} is not in the peak table; set metrics.peak_tflops to use its datasheet value)"
    return PeakFlops(measured, None, source, name)
