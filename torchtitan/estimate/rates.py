"""Sustained rates of a device by kind of work and shape, from published measurements (docs/estimate.md, "Rates").

Nothing here is chosen by fitting the training-throughput rows of tests/estimate_reference.toml: every number is a
published microbenchmark or vendor figure (cited beside it) or follows from one by a stated physical rule.

  GEMM      a sustained large-GEMM rate of the device and dtype at a reference shape (the MAMF shape search's best,
            replaced where a sustained measurement exists: the A100, B200, GB200, GB300 and MI355X at 8192^3, the
            700 W Hopper parts at mamf-finder's Maximum Sustainable Matmul FLOPS; the B300 takes the B200's raised by
            the power rule to its limit), times a shape factor (wave quantization of the output tiles over the SMs,
            and the pipeline prologue/epilogue of a tile's K loop) relative to the reference shape, times a power
            factor for parts run below their TDP (or a locked SM clock's factor where that binds first:
            compute_factor).
  float8    tensorwise: torch._scaled_mm's cuBLAS kernel (the MAMF FP8 figure, or a measurement at a stated shape
            where one exists: the 700 W Hopper parts, the GB200 and, bounded by it, the B200, the MI300X).
            rowwise: the CUTLASS rowwise kernel in the forward, and in the backward cuBLAS with unit scales plus a
            separate rescale pass of the output (torchao does this because the CUTLASS kernel without fast
            accumulation is slow). On Hopper with compiled blocks a rowwise linear is priced as a whole by torchao's
            measured speedup table over bf16 (ROWWISE_SPEEDUP, by forward M, K, N).
  attention the SDPA kernel's forward and backward TFLOPS by sequence length: on Hopper cuDNN attention (torch's
            choice there since 2.11's bundled cuDNN) or FlashAttention-2 (older torch), by head dim 64 / 128, from
            the FlashAttention-3 paper's H100 figures; A100, MI300X: FlashAttention-2 at head dim 128, their own
            published plateaus; B200 and GB200: torch SDPA's cuDNN backend, measured on a B200 less the
            benchmark's host time per call (the GB200 at the B200's TFLOPS); B300 and GB300: that curve times the
            GB300 / GB200 ratio measured with one cuDNN (Blackwell Ultra's doubled exponential units); MI355X:
            torch's SDPA measured on an MI355X; the same power factor. Hopper's and Blackwell's curves are
            benchmark loops (bursts): a run at the power limit sustains them times its GEMMs' sustained / burst
            ratio (attention_sustained_factor).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torchtitan.metrics.hardware import device_spec

# ---------------------------------------------------------------------------------------------------- GEMM
# MAMF: stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"
# (commit 744d01e, 2026-08): the best of a brute-force shape search of torch.matmul, mean of 100 iterations.
#   BF16: A100 SXM 271.2 (best 1024x10240x5120), H100 SXM 794.5 (2048x2048x13312, "H200 is the same"),
#         B200 SXM 1745.0 (1792x16128x3072), MI300X 668.4 (10240x15360x8192, tunableop).
#   FP8 (float8_e4m3fn, torch._scaled_mm tensorwise): H100 SXM 1402.6 (1024x9216x14336), H200 SXM 1453.4
#         (1280x4096x12032), B200 SXM 3432.5 (15360x4096x3072).
#   Blackwell pairs (bf16, FP8), the same shape search with the dtype the only change: B200 SXM 1745.0 / 3432.5
#         (torch 2.7.1+cu128), GB200 SXM 1822.0 (4096x9728x2048) / 3615.6 (19456x5120x1536) (torch
#         2.10.0.dev20250916+cu130; in the table since 68cd2e5, 2025-09-17), B300 SXM 1769.0 (12288x18432x1024) /
#         3353.3 (3072x6144x7168) (torch 2.9.1+cu130).


@dataclass(frozen=True)
class GemmSource:
    bf16_tflops: float  # dense bf16 at best_shape: the MAMF, or a sustained measurement that replaces it
    fp8_tflops: (
        float | None
    )  # MAMF, float8 tensorwise; None: not published (bf16 fraction of the FP8 peak used)
    best_shape: tuple[
        int, int, int
    ]  # (M, N, K) the bf16 figure is referred to (the shape factor's reference)
    table_peak: float  # the datasheet bf16 peak the MAMF is a fraction of
    table_fp8_peak: float | None
    sms: int  # streaming multiprocessors (CUs on AMD): the tiles' wave size
    tdp_w: float  # the power limit the MAMF was measured at (the part's TDP)


B200_MAMF_BF16, B200_MAMF_FP8 = 1745.0, 3432.5
GB200_MAMF_BF16, GB200_MAMF_FP8 = 1822.0, 3615.6
B300_MAMF_BF16, B300_MAMF_FP8 = 1769.0, 3353.3
GEMM_SOURCES: dict[str, GemmSource] = {
    "A100": GemmSource(271.2, None, (1024, 10240, 5120), 312.0, None, 108, 400.0),
    "H100 SXM": GemmSource(794.5, 1402.6, (2048, 2048, 13312), 989.0, 1978.0, 132, 700.0),
    "H200": GemmSource(794.5, 1453.4, (2048, 2048, 13312), 989.0, 1978.0, 132, 700.0),
    "B200": GemmSource(B200_MAMF_BF16, B200_MAMF_FP8, (1792, 16128, 3072), 2250.0, 4500.0, 148, 1000.0),
    "MI300X": GemmSource(668.4, None, (10240, 15360, 8192), 1307.0, 2615.0, 304, 750.0),
}
# Parts without a published MAMF take the fraction of their architecture's measured part (an assumption, listed in
# docs/estimate.md): Hopper PCIe/NVL parts that of the H100 SXM (114 SMs for PCIe), the 40 GB A100 the A100's,
# L40S (Ada, 142 SMs) the H100 SXM's fraction.
SAME_ARCH = {
    "H100 NVL": ("H100 SXM", 132, 400.0),
    "H100 PCIe": ("H100 SXM", 114, 350.0),
    "H200 NVL": ("H200", 132, 600.0),
    "A100 40GB": ("A100", 108, 400.0),
    "L40S": ("H100 SXM", 142, 350.0),
}

# Parts built on another part's silicon (its SMs or CUs, hence its kernels), sold with other links, memory or power
# (torchtitan/metrics/hardware.py): every rate keyed by device here and in collectives.py (attention curves and
# backend, the rowwise table, NCCL's channels, cuBLAS's persistent GEMMs, a mesh's bus-bandwidth fraction) is the
# twin's, while the part's own table entry gives its memory, HBM bandwidth and links. Its GEMM source is its own where
# one was measured on it (GEMM_SOURCES: the MI325X), else the twin's.
# The GH200's GPU is the H100 SXM's die: its measured MAMFs are bursts like the H100's / H200's (bf16 821.0 TFLOPS at
# 11264x19712x1536 on a "GH200 480GB", torch 2.4, stas00/ml-engineering#60; 828.6 at 1024x15360x4096 on the 144 GB
# part at its 900 W GPU limit, torch 2.6, the MAMF table at 744d01e; the H100's 794.5, the H200's 848-852), so it takes
# the twin's sustained 700 W rates (the MSMF below). No sustained GEMM figure of a GH200 was found: whatever a 900 W
# GPU limit sustains above 700 W is not counted (power_factor stops at 1), and a site's module cap (Alps ~660 W, JUPITER
# 680 W, CPU and memory included) is --estimate.power_limit_w with the GPU's share.
SILICON_TWINS = {
    "H800": "H100 SXM",
    "A800": "A100",
    "MI325X": "MI300X",
    "GH200": "H100 SXM",
    "GH200 144GB": "H100 SXM",
}


def silicon(device: str) -> str:
    """The device whose kernels `device` runs: its silicon twin, or itself."""
    return SILICON_TWINS.get(device, device)


# Power limit below TDP. Measured on H100 at 500 W: FBGEMM PR #2546 (pytorch/FBGEMM, 2024-04, "H100 500W"), bf16
# torch.mm 585.23 TFLOPS at 8192x8192x8192 (575.12 at 65536x8192x7168). At the TDP (700 W) the H100 sustains the
# MSMF below (755 at its shape). Throughput of a power-bound GEMM scales as (limit / TDP) ** POWER_EXPONENT, the
# exponent solved from these two sustained points (with the shape factor between the two shapes): see
# power_exponent() below. (Solved against the 700 W burst MAMF, 794.5, it was 0.89; against the sustained rate 0.68.)
H100_500W_BF16_8192 = 585.23
# Blackwell parts take their own exponent, solved the same way from two B200 rates at 8192^3: 1420 TFLOPS at the
# part's 1000 W (the B200 row below) and cuBLAS at a 750 W cap, measured by Meta's Triton team with their benchmark
# "denoise" script ("Locking GPU 4 power cap to 750 W", clocks capped at the 1965 MHz boost; torch.matmul on
# torch.randn fp16 operands, Blackwell's bf16 rate, triton.testing.do_bench over ~2 s, the median):
# facebookexperimental/triton PR #814 (2026-01-28) 1059.0 and PR #854 (2026-02-05) 1087.7 TFLOPS, their mean here.
# Exponent 0.97 where the H100's is 0.68: the rule applied to the GB200 -> GB300 step (1,200 -> 1,400 W) predicts
# x 1.162 with it (x 1.110 with the H100's) where Azure measured x 1.142.
B200_750W_BF16_8192 = (1059.0 + 1087.7) / 2
BLACKWELL_DEVICES = ("B200", "GB200", "B300", "GB300")


def _tile_utilization(m: float, n: float, sms: int) -> float:
    """Fraction of the SMs busy over a GEMM's waves of output tiles (the last wave is partly empty), for the best of
    the tile shapes cuBLAS picks between on large problems (128x256, 256x128, 128x128)."""
    best = 0.0
    for tm, tn in ((128, 256), (256, 128), (128, 128)):
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        waves = tiles / sms
        best = max(best, waves / math.ceil(waves))
    return best


# Each output tile runs its K loop through a software pipeline whose fill and drain cost about one 128-deep k-block
# (CUTLASS Hopper mainloops: 64-deep k-tiles, 2+ stages): efficiency k / (k + K_FILL).
K_FILL = 128.0


def shape_factor(m: float, n: float, k: float, sms: int) -> float:
    return _tile_utilization(m, n, sms) * k / (k + K_FILL)


# MI300X float8 (no MAMF FP8 figure is published for it): hipBLASLt's own benchmark, f8_r, 8192x8192x8192, 907
# TFLOPS on an MI300X (ROCm/hipBLASLt#1721, 2025-03-04, hipBLASLt develop 402603df, ROCm 6.3.1; the report says the
# part was "fixed to 1005Mhz"), referred to the bf16 MAMF's best shape by the shape factor. Without it the FP8 rate
# would be the bf16 fraction of the FP8 peak (1337 TFLOPS), which no measurement shows.
MI300X_FP8_8192 = 907.0


def _with_fp8_at(device: str, tflops: float, m: int, n: int, k: int) -> None:
    src = GEMM_SOURCES[device]
    at_best = tflops * shape_factor(*src.best_shape, src.sms) / shape_factor(m, n, k, src.sms)
    GEMM_SOURCES[device] = dataclasses.replace(src, fp8_tflops=at_best)


_with_fp8_at("MI300X", MI300X_FP8_8192, 8192, 8192, 8192)

# MI325X (the MI300X's 304 CDNA 3 CUs at a 1,000 W board power): its own MAMF, 784.9 TFLOPS bf16 at 13312x10240x8192
# (stas00/ml-engineering, commit 744d01e, the MAMF table: torch 2.6.0+rocm6.2.4, PYTORCH_TUNABLEOP_ENABLED=1, "1000W"),
# measured like the MI300X's 668.4 at 750 W. No FP8 GEMM figure of the part was found: its float8 rate is its bf16
# rate times the MI300X's measured float8 / bf16 ratio at one reference shape (hipBLASLt's 907 at 8192^3 over the bf16
# MAMF, both referred to the MAMF's shape), the same silicon's ratio.
MI325X_MAMF_BF16 = 784.9
_mi300x = GEMM_SOURCES["MI300X"]
GEMM_SOURCES["MI325X"] = GemmSource(
    MI325X_MAMF_BF16,
    MI325X_MAMF_BF16 * _mi300x.fp8_tflops / _mi300x.bf16_tflops,
    (13312, 10240, 8192),
    1307.0,
    2615.0,
    304,
    1000.0,
)

# MI355X (CDNA 4, 256 CUs, 1,400 W): HazyResearch/HipKittens f09e968 (arXiv 2511.08083), analysis/bf16_gemm/mi350x/
# mi355x_bf16_gemm.json and analysis/fp8_gemm/mi350x/mi355x_fp8_gemm.json (docker rocm/7.0-preview:
# rocm7.0_preview_pytorch_training_mi35x_beta, October 2025; 500 warm-ups and 100 timed iterations, torch.randn
# inputs): torch.matmul bf16 1521.3 TFLOPS at 8192^3 (1559.8 at 16384^3; the MAMF table's 1565.0 at
# 12288x8192x8192 agrees), hipBLASLt FP8 3233.2 at 8192^3 (3293.2 at 16384^3). Both referred to 8192^3, the shape
# measured. The power limit is not stated and is taken as the part's 1,400 W.
MI355X_BF16_8192, MI355X_FP8_8192 = 1521.3, 3233.2
GEMM_SOURCES["MI355X"] = GemmSource(
    MI355X_BF16_8192, MI355X_FP8_8192, (8192, 8192, 8192), 2516.6, 5033.2, 256, 1400.0
)

# B200 bf16 at training shapes: the MAMF (1745 at 1792x16128x3072, torch 2.7.1+cu128) is the best of a shape search,
# and on the B200 ordinary large shapes do not reach it: torchao's bench_matmul.py on an NVIDIA B200 (pytorch/ao
# PR #2427, 2025-06-23) measured torch.mm bf16 at 1410 (4096^3), 1450 (6144^3) and 1420 TFLOPS (8192^3), and vLLM's
# bench_fp8_gemm.py on a B200 (vllm-project/vllm PR #19566, 2025-06) measured torch's bf16 GEMM at Llama-3.1-8B's
# shapes at 1444 (M 2048, N 4096, K 4096) and 1513 TFLOPS (M 16384, N 6144, K 4096): 0.81-0.87 of the MAMF. So the
# B200's bf16 rate is referred to the 8192^3 measurement (cuBLAS of CUDA 12.8, the software of the torch 2.8/2.9
# builds of mid-2025); the power limit it ran at is not stated and is taken as the part's 1000 W. FP8: see the GB200
# below. (8192^3's shape factor is above the MAMF shape's, and gemm_efficiency caps the relative factor at 1, so the
# figure becomes the rate at the reference shape and at every shape the tiling model puts at or above it.)
B200_BF16_8192 = 1420.0
GEMM_SOURCES["B200"] = dataclasses.replace(GEMM_SOURCES["B200"], bf16_tflops=B200_BF16_8192)

# GB200 (the B200's GPU in a Grace Blackwell superchip, 1,200 W): Azure's AI-benchmarking-guide, "Azure ND GB200 v6
# Benchmark Results" (Azure/AI-benchmarking-guide and its forks, Azure_Results; driver 570.133.20, CUDA 12.8): FP8
# GEMMs through cuBLASLt (superbench's cublaslt_gemm) with random inputs after 10,000 warm-up iterations, 2876.6
# TFLOPS at 8192^3 (2895.6 at 6144x12288x12288, 2906.9 at 16384^3; 2624.5 at 8192^3 in the guide's earlier run on
# driver 570.99). The method measures what the rates here mean: on its ND H100 v5 and ND H200 v5 (700 W) it gives
# 1290.1 / 1300.6 TFLOPS at 8192^3 and 1351.4 / 1318.0 at 6144x12288x12288, where this file's Hopper float8 rate
# (the MSMF below) gives 1296 and 1330. No sustained GB200 bf16 GEMM figure was found: bf16 is the FP8 figure times
# the GB200's own bf16 / FP8 ratio of its two MAMFs (1822.0 / 3615.6, above: one shape search, the dtype the only
# change; the B200's pair gives 1745.0 / 3432.5, 0.9 % higher, which this used until 2026-12-02), 1450 TFLOPS at
# 8192^3, 2 % above the B200's measured 1420 there (not the datasheets' 11 %: 2,500 vs 2,250 TFLOPS). The GB200's
# MAMFs themselves are bursts of a shape search: the FP8 one is 1.26x Azure's sustained 8192^3 figure, as the
# B200's bf16 MAMF is 1.23x its measured 8192^3 rate. Both figures are referred to 8192^3, the shape measured.
# SMs: the B200's 148 (NVIDIA publishes no count for the GB200; an assumption).
GB200_FP8_8192 = 2876.6
GB200_BF16_8192 = GB200_FP8_8192 * GB200_MAMF_BF16 / GB200_MAMF_FP8
GEMM_SOURCES["GB200"] = GemmSource(
    GB200_BF16_8192, GB200_FP8_8192, (8192, 8192, 8192), 2500.0, 5000.0, 148, 1200.0
)
# B200 float8: no B200 measurement of FP8 GEMMs at training shapes was found, and its MAMF (3432.5, a shape search's
# best burst) overstates a sustained rate as its bf16 MAMF does (1745 against 1420 measured at 8192^3: 0.814). The
# GB200 measurement bounds it: the same die at a higher power limit (1,200 W against 1,000) sustains at least what
# the B200 does, and the B200's own bf16 ratio gives about the same (0.814 x 3432.5 = 2793, 3 % below). So the B200's
# float8 rate is the GB200's 8192^3 figure, taken like its bf16 1420: the rate at its reference shape and above.
GEMM_SOURCES["B200"] = dataclasses.replace(GEMM_SOURCES["B200"], fp8_tflops=GB200_FP8_8192)

# A100 bf16 at training shapes, by the same rule: its MAMF (271.2 at 1024x10240x5120) is the best of a shape search,
# and the ordinary large shape does not reach it. Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster
# When Given 'Predictable' Data!" (thonking.ai, 2024): torch.mm through cuBLAS at 8192x8192x8192 on an A100 (SXM,
# 400 W power limit; "83% flop utilization" of 312) runs at 258 TFLOPS, and at 257 with torch.randn inputs (295 with
# zeros: the chip is power-limited, and switching activity depends on the data). Training multiplies data of that
# kind, and mamf-finder itself times torch.randn operands, so the randn figure is the one taken. 8192^3's shape
# factor is above the MAMF shape's here too (2048 tiles fill 19 waves of 108 SMs to 99.8 %), so the figure becomes
# the rate at 8192^3 and at every shape the tiling model puts at or above it; smaller shapes keep their relative
# shape factor. The 40 GB part takes the same rate (SAME_ARCH).
A100_BF16_8192 = 257.0
GEMM_SOURCES["A100"] = dataclasses.replace(GEMM_SOURCES["A100"], bf16_tflops=A100_BF16_8192)

# 700 W Hopper SXM parts (H100 SXM, H200) at their sustained rate. The MAMF above is a burst: mamf-finder's newer
# revision (stas00/ml-engineering, compute/accelerator/benchmarks/README.md at commit fe12f4e4b, "How MAMF and MSMF
# are defined" and "What was measured: alone vs all-8 concurrent") separates the boost-clock burst from the
# Maximum *Sustainable* Matmul FLOPS (MSMF: after up to 20 s of 8192^3 bf16 matmuls have settled the clock at the
# power limit, the fastest shape whose rate holds steady over a 2-4 s window; "the steady rate under full load, which
# matches real training throughput"; boost bursts "draw only ~150-330 W"). On an 8x H200 node (torch 2.14.0+cu130,
# every other GPU running a matmul meanwhile, as in training; mamf-finder-all-gpus.py) the bf16 node MSMF is 755
# TFLOPS (the median GPU; the slowest 745; GPU0 alone 744.8 over 5 runs, one of which found 745 at 1536x2816x6144)
# where its burst MAMF is 848-852 (three table means: 848.4, 847.2, 852.1); float8 (e4m3, torch._scaled_mm): the
# source's expected MSMF is "about 1330" (and "about 1337" in another run), with 1536x2816 climbing to 1335-1372 at
# K=10240; a run that missed that shape "came out 1281 instead of about 1330". 1330 is taken at 1536x2816x10240.
# Both shapes fill one wave of 128x256 tiles on 132 SMs; the tiling model's K fill does not hold at the power limit
# (the source's K walk: 2816x1536 sustains 727 at K=20480, 741 at 10240, 749 at 6144), so each figure is taken as the
# rate at the reference shape, and smaller shapes keep their relative factor.
# The H100 SXM takes the H200's figures: the same GH100 die at the same 700 W limit (the MAMF table lists the H100's
# bf16 MAMF with "H200 is the same"). The same source's B200 MSMF (1423.8 on one GPU alone, a mean of 5 runs; node
# 1439) agrees with the B200's 8192^3 figure above within 1.3 %: the 8192^3 measurements the A100 and B200 use are
# sustained rates too.
# The 500 W H100 keeps its own measurement (FBGEMM's 585.23 at 8192^3): the power exponent below is solved from
# these two sustained points.
HOPPER_700W_MSMF_BF16 = 755.0
HOPPER_700W_MSMF_BF16_SHAPE = (1536, 2816, 6144)
HOPPER_700W_MSMF_FP8 = 1330.0
HOPPER_700W_MSMF_FP8_SHAPE = (1536, 2816, 10240)
# The burst figures they replace (the MAMF table above), kept for the attention curves' burst-to-sustained factor.
HOPPER_MAMF_BF16 = GEMM_SOURCES["H100 SXM"].bf16_tflops
HOPPER_MAMF_SHAPE = GEMM_SOURCES["H100 SXM"].best_shape
for _part in ("H100 SXM", "H200"):
    GEMM_SOURCES[_part] = dataclasses.replace(
        GEMM_SOURCES[_part],
        bf16_tflops=HOPPER_700W_MSMF_BF16,
        fp8_tflops=HOPPER_700W_MSMF_FP8,
        best_shape=HOPPER_700W_MSMF_BF16_SHAPE,
    )


def _exponent_from(part: str, limit_w: float, tflops_8192: float) -> float:
    """The exponent e with rate(limit) = rate(TDP) x (limit / TDP) ** e, from the part's rate at 8192^3 at its TDP
    (its GEMM source carried to 8192^3 by the shape factor, capped at the reference rate) and one measured below."""
    src = GEMM_SOURCES[part]
    factor = min(1.0, shape_factor(8192, 8192, 8192, src.sms) / shape_factor(*src.best_shape, src.sms))
    return math.log(tflops_8192 / (src.bf16_tflops * factor)) / math.log(limit_w / src.tdp_w)


POWER_EXPONENT = _exponent_from("H100 SXM", 500.0, H100_500W_BF16_8192)
BLACKWELL_POWER_EXPONENT = _exponent_from("B200", 750.0, B200_750W_BF16_8192)


def power_exponent(device: str) -> float:
    """The power rule's exponent for `device`: Blackwell's (two B200 measurements) on Blackwell parts, the H100's
    elsewhere (the only other architecture measured at two power limits)."""
    return BLACKWELL_POWER_EXPONENT if silicon(device) in BLACKWELL_DEVICES else POWER_EXPONENT


# Blackwell Ultra (B300, GB300): the same dense bf16 / FP8 tensor-core peaks as Blackwell (2,250 / 4,500 TFLOPS on
# the HGX part, 2,500 / 5,000 in the NVL72 rack) at a higher power limit (1,100 W and 1,400 W against 1,000 and
# 1,200). GB300: the Azure guide's method on its ND GB300 v6 (egmsft/AI-benchmarking-guide 18e80a2,
# Azure_Results/ND_GB300_v6_results.md: CUDA 13.0, driver 580.82.07; cuBLASLt FP8, random inputs, 10,000 warm-ups)
# gives 3286.3 TFLOPS at 8192^3 (3308.5 at 16384^3, 3279.5 at 6144x12288x12288), 1.142x the GB200's 2876.6; bf16 by
# the bf16 / FP8 ratio of its die's MAMFs, the B300's (1769.0 / 3353.3: no GB300 MAMF is published; the B200's pair
# until 2026-12-02, 3.6 % lower), 1734 TFLOPS. B300: no sustained GEMM figure was found (its MAMFs, bf16 1769.0 at
# 12288x18432x1024 and float8 3353.3 at 3072x6144x7168 on torch 2.9.1+cu130, are the B200's within 1.4 / 2.3 %: bursts,
# which the power limit does not bind), so it takes the B200's sustained rates raised by the power rule to its limit,
# (1100 / 1000) ** BLACKWELL_POWER_EXPONENT = 1.097 (1.067 with the H100's exponent until 2026-12-02). The rule's check
# on these parts: from the GB200 to the GB300 it predicts (1400 / 1200) ** 0.97 = 1.162 where Azure measured 1.142. A
# second check: the GB300's bf16 here, 1,734 TFLOPS at 8192^3, against torch.matmul's 1,717 there on a GB300 in
# facebookexperimental/triton PR #740 (2025-12-17; power limit not stated).
GB300_FP8_8192 = 3286.3
GEMM_SOURCES["GB300"] = dataclasses.replace(
    GEMM_SOURCES["GB200"],
    bf16_tflops=GB300_FP8_8192 * B300_MAMF_BF16 / B300_MAMF_FP8,
    fp8_tflops=GB300_FP8_8192,
    tdp_w=1400.0,
)
_b200 = GEMM_SOURCES["B200"]
_b300_gain = (1100.0 / _b200.tdp_w) ** BLACKWELL_POWER_EXPONENT
GEMM_SOURCES["B300"] = dataclasses.replace(
    _b200, bf16_tflops=_b200.bf16_tflops * _b300_gain, fp8_tflops=_b200.fp8_tflops * _b300_gain, tdp_w=1100.0
)


def _hopper_burst_to_sustained() -> float:
    """Sustained / burst rate of a large GEMM on a 700 W Hopper part at the same shape: the MSMF-referred rate over
    the MAMF-referred one (0.932 at every shape below both reference shapes, e.g. 8192^3: 736 vs 790 TFLOPS)."""
    sms = GEMM_SOURCES["H100 SXM"].sms
    at = (8192, 8192, 8192, sms)
    sustained = HOPPER_700W_MSMF_BF16 * shape_factor(*at) / shape_factor(*HOPPER_700W_MSMF_BF16_SHAPE, sms)
    burst = HOPPER_MAMF_BF16 * shape_factor(*at) / shape_factor(*HOPPER_MAMF_SHAPE, sms)
    return sustained / burst


# The Hopper attention curves (FlashAttention-3 paper, cudnn-frontend's 10-iteration runs) are benchmark loops like
# the MAMF, not minutes at the power limit. Before the MSMF, the power exponent (solved against the MAMF) carried this
# burst-to-sustained loss into every power-capped Hopper part's attention and into none at 700 W; now the power
# factor relates sustained rates, and the loss is applied on its own, at every power limit: a Hopper part's
# attention sustains its measured curve x this factor x the power factor (500 W: 0.932 x 0.796 = 0.742, the 0.741
# it had before). An assumption: attention's tensor-core work loses at the power limit what a GEMM loses; no
# sustained attention measurement of a Hopper part was found. Blackwell: see BLACKWELL_ATTENTION_SUSTAINED. Other
# devices' attention curves are left as measured.
HOPPER_ATTENTION_SUSTAINED = _hopper_burst_to_sustained()

# SM clock locked below boost (`nvidia-smi -lgc F,F`, as benchmarks do to steady their timing). A tensor core does a
# fixed number of FMAs a clock, so a compute-bound kernel that the power limit does not hold back runs at its burst
# rate (the clock at boost, the board below its limit: mamf-finder's MAMF, the attention curves' benchmark loops)
# times F / boost; the power-limited sustained rate still caps it. Memory-bound work (elementwise, the optimizer,
# collectives) is left as it is: the HBM and link clocks are not the SM clock. Known per part: the boost clock and
# the sustained / burst ratio of its GEMMs at the same power limit.
#   700 W Hopper SXM (H100 SXM, H200): 1,980 MHz (the H100 SXM measured here: docs/performance.md's "1980 MHz max SM
#   clock"; the H200 of cudnn-frontend's SDPA benchmark README, "application clocks 3201 / 1980 MHz"); sustained /
#   burst HOPPER_ATTENTION_SUSTAINED (0.932, the MSMF over the MAMF table's 794.5, which the attention factor uses
#   too). Not exact: mamf-finder's H200 node held its MSMF (755) at 1835-1873 MHz where its own burst MAMF was
#   848-852, so at the power limit the rate fell 5 % below the clock's share of the burst (796 at 1,854 MHz); with
#   that pair's ratio (0.888) in place of 0.932 an H200 locked at 1,500 MHz computes 5 % faster than priced here.
#   B200: 1,965 MHz (`nvidia-smi -q` of a B200 at its defaults, "Max Clocks ... SM : 1965 MHz", in NVIDIA/cudnn-frontend
#   7606332 benchmark/Llama-3.2-1B-Training/artifacts/b200_run_plot.b200.txt; Meta's Triton benchmark script caps
#   "frequency to 1965", facebookexperimental/triton PR #814); sustained / burst = 1420 / 1745 (the 8192^3
#   measurement over the MAMF, 0.814).
# Blackwell's attention at the power limit, by the Hopper rule above. The curves every Blackwell part takes are
# bursts on a B200: cuDNN's, timed by cudnn-frontend's benchmark (5 warm-up and 10 timed calls, with sleeps "to avoid
# GPU throttling"), and FlashAttention-2 at the H100's curves, which the same benchmark's B200 run matched. So a run
# sustains them times the B200's GEMM sustained / burst ratio at its 1,000 W, the 8192^3 rate over the MAMF (0.814;
# the GB200, B300 and GB300 take the B200's: an assumption, as their curves are). Checked, not set, by a measurement
# of attention itself: flashinfer-ai/flashinfer PR #2899 (2026-03-26) times 100 back-to-back calls of FA4 in bf16 on
# a B200 (batch 4, 8K, 16 heads, head dim 128): "Iters 10- 19: avg=1450 TFLOPS (peak)" .. "Iters 70- 79: avg=1237
# TFLOPS (fully throttled, -15%)", "SM clocks drop from 1965 MHz to ~1580 MHz", power ~1000 W: 0.853 after 70 calls,
# with the clock at 0.80 of boost; mamf-finder's sustained rate is read after seconds, not calls. Until 2026-12-03
# Blackwell's attention curves were priced as measured (docs/estimate_log.md, "Blackwell's attention at the power
# limit").
BLACKWELL_ATTENTION_SUSTAINED = B200_BF16_8192 / B200_MAMF_BF16
LOCKABLE_CLOCK = {  # part: (boost clock MHz, sustained / burst GEMM rate at its TDP)
    "H100 SXM": (1980.0, HOPPER_ATTENTION_SUSTAINED),
    "H200": (1980.0, HOPPER_ATTENTION_SUSTAINED),
    "B200": (1965.0, BLACKWELL_ATTENTION_SUSTAINED),
}


def compute_factor(device: str, power_limit_w: float | None, sm_clock_mhz: float | None = None) -> float:
    """The factor on the compute rates (GEMMs, attention): the power factor, or the locked clock's rate where the
    clock binds first: min(power factor, clock / boost / (sustained / burst))."""
    power = power_factor(device, power_limit_w)
    if sm_clock_mhz is None:
        return power
    boost, sustained_over_burst = LOCKABLE_CLOCK[device]
    return min(power, sm_clock_mhz / boost / sustained_over_burst)


def gemm_source(device: str) -> tuple[GemmSource, str]:
    """The GEMM source of a hardware-table device name and a note of what it was derived from."""
    if device in GEMM_SOURCES:
        return GEMM_SOURCES[device], "MAMF of this device"
    if device in SAME_ARCH:
        base, sms, tdp = SAME_ARCH[device]
        b = GEMM_SOURCES[base]
        return GemmSource(
            b.bf16_tflops, b.fp8_tflops, b.best_shape, b.table_peak, b.table_fp8_peak, sms, tdp
        ), (f"MAMF fraction of {base}")
    if device in SILICON_TWINS:
        return GEMM_SOURCES[silicon(device)], f"the rates of {silicon(device)}, the same silicon"
    raise KeyError(device)


def compute_power_w(device: str, power_limit_w: float | None) -> float | None:
    """The power limit the compute rates stand for: the part's own below its source's TDP, else that TDP (nothing
    is added above it); None where no GEMM source exists (a CPU: measured rates)."""
    try:
        tdp = gemm_source(device)[0].tdp_w
    except KeyError:
        return None
    return tdp if power_limit_w is None else min(power_limit_w, tdp)


def power_factor(device: str, power_limit_w: float | None) -> float:
    """The compute rates' factor at `compute_power_w`, the limit the report names."""
    if power_limit_w is None:
        return 1.0
    tdp = gemm_source(device)[0].tdp_w  # KeyError for a part without a GEMM source, as before
    return (compute_power_w(device, power_limit_w) / tdp) ** power_exponent(device)


# A CPU has no datasheet peak: its "peak" is this machine's measured matmul rate (the estimator's calibration, or
# --estimate.peak_tflops from one), already a sustained rate, so nothing discounts it (and no shape factor: the
# calibration times the run's own shapes).
MEASURED_PEAK_DEVICES = ("CPU",)


def gemm_fraction(device: str, dtype: str) -> float:
    """Sustained fraction of the datasheet peak of `dtype` ("bf16" or "fp8") at the device's best shape."""
    if device in MEASURED_PEAK_DEVICES:
        return 1.0
    src, _ = gemm_source(device)
    if dtype == "fp8" and src.fp8_tflops is not None and src.table_fp8_peak:
        return src.fp8_tflops / src.table_fp8_peak
    return src.bf16_tflops / src.table_peak


def gemm_efficiency(device: str, dtype: str, m: float, n: float, k: float) -> float:
    """Fraction of the datasheet peak a [m,k]x[k,n] GEMM sustains (before the power factor)."""
    if device in MEASURED_PEAK_DEVICES:
        return 1.0
    src, _ = gemm_source(device)
    rel = shape_factor(m, n, k, src.sms) / shape_factor(*src.best_shape, src.sms)
    return gemm_fraction(device, dtype) * min(1.0, rel)


# float8 rowwise (torchao recipe "rowwise"): forward y = x W^T through torch's CUTLASS rowwise kernel with fast
# accumulation; pytorch/pytorch#147971 (2025-02, H100): "most shapes are within 90-100% of tensor-wise efficiency,
# but there's a long tail down to 50%" -> 0.95 of the tensorwise rate for the large training shapes. Backward
# (slow accumulation): torchao calls cuBLAS with unit scales and rescales the output in a separate pass
# (pytorch/ao#1325), so those GEMMs run at the tensorwise rate plus RESCALE_BYTES per output element (fp32 output
# written and read, bf16 result written).
ROWWISE_FWD_RATE = 0.95
ROWWISE_RESCALE_BYTES = 10

# float8 rowwise linear on Hopper, measured as a whole: torchao's published speedup table "Speedup observed vs
# bfloat16 for LayerNorm -> Linear -> Sigmoid fwd + bwd by forward M, K, N, dynamic row-wise scaling, PyTorch
# version 2.8.0a0+git48807d5", NVIDIA H100 (pytorch/ao fdddb2cfa, 2025-06-06, docs/static/fp8-rowwise-perf.png,
# produced by benchmarks/float8/float8_roofline.py: both modules torch.compile'd, GPU kernel time of forward +
# backward). It prices what the GEMM-and-casts model above cannot see at small shapes (the CUTLASS rowwise kernel's
# long tail, cast kernels that do not saturate HBM). Transcribed cell by cell: ROWWISE_SPEEDUP[M][K] is the row of
# speedups over N, each axis 1024, 2048, ..., 32768. The LayerNorm and Sigmoid are in both times, so at small
# shapes the linear alone is, if anything, slower than this table says (the table is the optimistic reading).
ROWWISE_AXIS = (1024, 2048, 4096, 8192, 16384, 32768)
ROWWISE_SPEEDUP = (
    (  # M = 1024
        (0.42, 0.42, 0.50, 0.51, 0.56, 0.56),
        (0.40, 0.38, 0.42, 0.50, 0.50, 0.56),
        (0.48, 0.43, 0.46, 0.53, 0.57, 0.60),
        (0.45, 0.48, 0.54, 0.62, 0.60, 0.62),
        (0.46, 0.48, 0.54, 0.60, 0.60, 0.61),
        (0.45, 0.50, 0.55, 0.60, 0.62, 0.65),
    ),
    (  # M = 2048
        (0.43, 0.43, 0.48, 0.55, 0.62, 0.65),
        (0.38, 0.45, 0.58, 0.65, 0.72, 0.75),
        (0.43, 0.50, 0.68, 0.78, 0.81, 0.82),
        (0.46, 0.58, 0.73, 0.82, 0.87, 0.89),
        (0.48, 0.62, 0.75, 0.83, 0.84, 0.85),
        (0.50, 0.64, 0.75, 0.84, 0.83, 0.99),
    ),
    (  # M = 4096
        (0.45, 0.47, 0.57, 0.66, 0.72, 0.76),
        (0.43, 0.53, 0.70, 0.83, 0.90, 0.91),
        (0.44, 0.64, 0.84, 1.01, 1.01, 1.04),
        (0.53, 0.72, 0.91, 1.01, 1.07, 1.13),
        (0.53, 0.74, 0.92, 1.05, 1.10, 1.18),
        (0.54, 0.75, 0.93, 1.02, 1.17, 1.18),
    ),
    (  # M = 8192
        (0.48, 0.52, 0.65, 0.77, 0.83, 0.84),
        (0.45, 0.64, 0.82, 1.01, 1.03, 1.06),
        (0.52, 0.76, 1.00, 1.13, 1.17, 1.19),
        (0.59, 0.85, 1.05, 1.20, 1.31, 1.41),
        (0.58, 0.82, 1.03, 1.22, 1.37, 1.40),
        (0.59, 0.82, 1.04, 1.30, 1.36, 1.46),
    ),
    (  # M = 16384
        (0.48, 0.58, 0.73, 0.86, 0.85, 0.89),
        (0.51, 0.70, 0.90, 1.05, 1.07, 1.15),
        (0.57, 0.79, 1.02, 1.20, 1.26, 1.40),
        (0.61, 0.87, 1.08, 1.33, 1.39, 1.49),
        (0.59, 0.83, 1.07, 1.34, 1.42, 1.55),
        (0.60, 0.85, 1.16, 1.35, 1.48, 1.72),
    ),
    (  # M = 32768
        (0.51, 0.62, 0.77, 0.87, 0.88, 0.94),
        (0.54, 0.73, 0.91, 1.08, 1.14, 1.27),
        (0.59, 0.81, 1.04, 1.28, 1.35, 1.49),
        (0.63, 0.87, 1.11, 1.41, 1.50, 1.62),
        (0.60, 0.83, 1.16, 1.39, 1.49, 1.73),
        (0.63, 0.93, 1.16, 1.48, 1.70, 1.52),
    ),
)
# The parts the table applies to: Hopper, whose rowwise path (CUTLASS forward, cuBLAS + rescale backward) it measured.
ROWWISE_TABLE_DEVICES = ("H100 SXM", "H100 PCIe", "H100 NVL", "H200", "H200 NVL")


def _axis_pos(x: float) -> tuple[int, float]:
    """(lower index, fraction) of x on ROWWISE_AXIS in log2, clamped to the measured range (no extrapolation)."""
    lo, hi = math.log2(ROWWISE_AXIS[0]), math.log2(ROWWISE_AXIS[-1])
    t = (min(max(math.log2(max(x, 1.0)), lo), hi) - lo) / (hi - lo) * (len(ROWWISE_AXIS) - 1)
    i = min(int(t), len(ROWWISE_AXIS) - 2)
    return i, t - i


def rowwise_linear_speedup(m: float, k: float, n: float) -> float:
    """torchao's measured forward+backward speedup of a float8 rowwise linear over bf16 at forward shape (M, K, N):
    trilinear interpolation in log2 of each dimension; dimensions outside 1024..32768 take the nearest edge."""
    (i, fi), (j, fj), (q, fl) = _axis_pos(m), _axis_pos(k), _axis_pos(n)
    out = 0.0
    for di, wi in ((0, 1 - fi), (1, fi)):
        for dj, wj in ((0, 1 - fj), (1, fj)):
            for dl, wl in ((0, 1 - fl), (1, fl)):
                out += wi * wj * wl * ROWWISE_SPEEDUP[i + di][j + dj][q + dl]
    return out


# ----------------------------------------------------------------------------------------------- attention
# FlashAttention-2 on H100 80GB SXM5, head dim 128, bf16 (Shah et al. 2024, FlashAttention-3 paper, arXiv
# 2407.08608, Figures 5 and 6), TFLOPS on the FLOPs the kernel does (causal: half the scores), by sequence length:
FA_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
FA2_H100_FWD_CAUSAL = (191.0, 260.0, 298.0, 319.0, 333.0, 335.0)
FA2_H100_FWD = (309.0, 350.0, 362.0, 368.0, 370.0, 370.0)  # non-causal
FA2_H100_BWD = (214.0, 260.0, 291.0, 310.0, 318.0, 322.0)  # non-causal (the paper's backward figure)
# Causal backward is not plotted: it is taken as the non-causal backward x the forward's causal/non-causal ratio at
# the same length (the same masking of the diagonal blocks slows both).
# A100: FlashAttention-2's own A100 benchmark, forward + backward TFLOPS by sequence length, A100 80GB SXM4, head dim
# 128, causal, hidden 2048, batch x seq = 16K tokens (Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png,
# committed with the FlashAttention-2 release, 4f285b35, 2023-07-17; panel (d), the figure of the FA2 paper, arXiv
# 2307.08691, section 4.1). The benchmark counts fwd + bwd as 3.5x the forward FLOPs, as the estimator does. Only the
# sum is published for A100, so the split into forward and backward keeps the H100 curves' ratio at each length: at
# every length the A100 curves are the H100 ones scaled by (this figure / the H100 curves' own fwd + bwd). Check: the
# scaled non-causal forward at 16K is 0.74 of 312, the paper's "up to 73% of the theoretical max throughput in the
# forward pass" (and the backward 0.64, its "up to 63%" in the backward pass).
FA2_A100_FWDBWD_CAUSAL = (99.0, 133.0, 155.0, 173.0, 182.0, 189.0)
# The same figure's panel (c), causal at head dim 64: 0.89-0.91 of head dim 128 at every length, as FA2 on the H100
# (below); an A100 run's rate is log2-interpolated between the two head dims as on Hopper (until 2026-12-03 every
# head dim took panel (d)).
FA2_A100_FWDBWD_CAUSAL_D64 = (88.0, 119.0, 140.0, 156.0, 165.0, 171.0)
# MI300X: FlashAttention-2 on ROCm (Composable Kernel), MI300X, ROCm 6.3.2, bf16, head dim 128, non-causal, one
# sequence of 16384 (ROCm/flash-attention#142, 2025-05-18, its benchmark_flash_attention.py): forward 353.22,
# backward 194.43 TFLOPS, i.e. 0.27 and 0.15 of the 1307 TFLOPS peak where the H100's FA2 sustains 0.37 and 0.33 of
# 989. torch's SDPA on ROCm runs AOTriton's kernels, which published comparisons put at or below CK's (so these
# are an upper bound for SDPA). The H100 curve's shape over sequence length is kept; forward and backward plateaus
# are scaled to these two figures.
FA2_MI300X_FWD_16K = 353.22
FA2_MI300X_BWD_16K = 194.43
MI300X_PEAK = 1307.0
# MI355X: torch's own SDPA, measured beside AMD's AITER kernels by the HipKittens paper (HazyResearch/HipKittens f09e968,
# arXiv 2511.08083: the "PyTorch SDPA" baselines of analysis/attn/fwd/plot.py and analysis/attn/bkwd/plot.py; MI355X,
# the docker of the GEMM figures above, bf16, batch 16 x 16 heads, head dim 128, MHA; TFLOPS on causal-halved FLOPs,
# backward 2.5x the forward's, as the estimator counts them), by sequence length. torch's SDPA on ROCm runs AOTriton's
# flash kernels (CK's when torch.backends.cuda.preferred_rocm_fa_library("ck") is set), which this trainer and
# torchtitan call; at 8K causal they sustain 630 forward and 224 backward where AITER's own kernels reach 1173 and 1034
# (analysis/attn/*/benchmark/mi355x_mha_*.json of the same commit: the ceiling, not what torch runs). The torch
# version inside the docker and the backend SDPA chose are not stated.
SDPA_MI355X_SEQ = (1024, 2048, 4096, 8192, 16384)
SDPA_MI355X_FWD_CAUSAL = (54.8, 246.4, 421.8, 630.4, 761.6)
SDPA_MI355X_FWD = (452.9, 579.4, 593.9, 821.8, 872.8)  # no mask
SDPA_MI355X_BWD_CAUSAL = (109.51, 156.71, 142.82, 224.01, 259.14)
SDPA_MI355X_BWD = (220.27, 273.06, 301.24, 309.30, 311.66)  # no mask


def _interp_on(seq: float, xs: tuple[int, ...], ys: tuple[float, ...]) -> float:
    """Log2-linear interpolation of a measured curve ys over sequence lengths xs: proportional to the work below its
    first point (short sequences are launch- and tail-bound), flat above its last."""
    if seq <= xs[0]:
        return ys[0] * max(seq, 1.0) / xs[0]
    if seq >= xs[-1]:
        return ys[-1]
    x = math.log2(seq)
    for i in range(len(xs) - 1):
        lo, hi = math.log2(xs[i]), math.log2(xs[i + 1])
        if lo <= x <= hi:
            return ys[i] + (x - lo) / (hi - lo) * (ys[i + 1] - ys[i])
    return ys[-1]


def _interp(seq: float, ys: tuple[float, ...]) -> float:
    """A FlashAttention curve (over FA_SEQ) at this sequence length."""
    return _interp_on(seq, FA_SEQ, ys)


# Hopper (H100, H200; sm90), by head dim and SDPA backend. FlashAttention-2 at head dims 64 and 128, and cuDNN at
# head dim 64: the same FlashAttention-3 paper figures (arXiv 2407.08608, Figure 5: forward, non-causal and causal,
# head dims 64 / 128 / 256; Figure 6: backward, non-causal; H100 80GB SXM5, bf16, batch x seq = 16K tokens, hidden
# 2048), whose FlashAttention-2 bars at head dim 128 are the FA2_H100_* curves above; its "cuDNN" bars are NVIDIA's
# fused attention of mid-2024 (cuDNN 9), the kernels torch's SDPA cuDNN backend calls (aten/src/ATen/native/cudnn/
# MHA.cpp builds a cudnn-frontend SDPA graph). The values are the bars' printed labels (read from transcriptions of
# the figure images; their FA2 head-dim-128 values equal the FA2_H100_* curves digit for digit).
FA2_H100_FWD_D64 = (282.0, 306.0, 318.0, 321.0, 322.0, 324.0)  # non-causal
FA2_H100_FWD_CAUSAL_D64 = (180.0, 229.0, 262.0, 284.0, 295.0, 299.0)
FA2_H100_BWD_D64 = (198.0, 238.0, 264.0, 279.0, 287.0, 291.0)  # non-causal
CUDNN_H100_FWD_D64 = (335.0, 373.0, 395.0, 408.0, 412.0, 413.0)
CUDNN_H100_FWD_CAUSAL_D64 = (225.0, 288.0, 334.0, 363.0, 379.0, 388.0)
CUDNN_H100_BWD_D64 = (266.0, 348.0, 395.0, 417.0, 432.0, 433.0)
# cuDNN at head dim 128: cuDNN 9.19, the version torch 2.11 bundles, on an H200: NVIDIA/cudnn-frontend (v1.19.0,
# df73764, 2026-03-09) benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv
# (cuDNN backend 91901, the cudnn Python graph API; bf16, batch 1, 64 query / 8 KV heads, 10 iterations;
# "top_left" = causal; TFLOPS on causal-halved FLOPs, backward 2.5x the forward's, as the estimator counts them).
# The paper's mid-2024 cuDNN gave 529 / 518 TFLOPS (forward causal / backward non-causal, 8K) where 9.19 gives
# 644 / 594. Head dim 64 stays at the paper's cuDNN: no newer head-dim-64 measurement was found, and
# cudnn-frontend's Llama-3.2-1B training benchmark (H200 at 1500 MHz, cuDNN 9.9, head dim 64, 2 x 8192: 0.357 s
# per iteration with cuDNN, 0.397 s with FA2) fits the paper's head-dim-64 rates (0.035 s apart at full clock,
# 0.046 s scaled to 1500 MHz) better than the same rates raised by 9.19's gain at head dim 128 (0.048 / 0.064 s).
CUDNN919_SEQ = (2048, 4096, 8192, 16384, 32768)
CUDNN919_H200_FWD = (633.0, 671.0, 691.0, 702.0, 693.0)  # no mask
CUDNN919_H200_FWD_CAUSAL = (484.0, 591.0, 644.0, 673.0, 688.0)
CUDNN919_H200_BWD = (504.0, 560.0, 594.0, 612.0, 572.0)  # no mask
CUDNN919_H200_BWD_CAUSAL = (370.0, 474.0, 541.0, 579.0, 581.0)
# (lengths, forward non-causal, forward causal, backward non-causal, backward causal or None) by backend, head dim;
# None: the causal backward is the non-causal one x the forward's causal / non-causal ratio (as for FA2 above)
_HOPPER_CURVES = {
    ("flash", 64): (FA_SEQ, FA2_H100_FWD_D64, FA2_H100_FWD_CAUSAL_D64, FA2_H100_BWD_D64, None),
    ("flash", 128): (FA_SEQ, FA2_H100_FWD, FA2_H100_FWD_CAUSAL, FA2_H100_BWD, None),
    ("cudnn", 64): (FA_SEQ, CUDNN_H100_FWD_D64, CUDNN_H100_FWD_CAUSAL_D64, CUDNN_H100_BWD_D64, None),
    ("cudnn", 128): (
        CUDNN919_SEQ,
        CUDNN919_H200_FWD,
        CUDNN919_H200_FWD_CAUSAL,
        CUDNN919_H200_BWD,
        CUDNN919_H200_BWD_CAUSAL,
    ),
}
HOPPER_ATTENTION_DEVICES = ("H100 SXM", "H100 PCIe", "H100 NVL", "H200", "H200 NVL")
# torch's SDPA puts cuDNN first on sm90 and sm100 (minor 0 or 3) when the runtime cuDNN is newer than 9.15.0
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp `check_prefer_cudnn_attention`, since pytorch/pytorch
# PR #162073 of 2025-09 for torch 2.9, the 9.15 threshold for the seq-len fix of #169849). torch 2.11.0's wheel
# requires nvidia-cudnn-cu13==9.19.0.56 (its PyPI metadata; pytorch/pytorch PR #175672), the torch this trainer's
# GPU runs use, so a Hopper or B200 run of this trainer runs cuDNN attention. Older software ran FlashAttention-2
# on Hopper: torch 2.5.0 put cuDNN first on H100 and 2.5.1 made it opt-in again (pytorch/pytorch#138522 after
# #139298); the nightly of 2024-12 chose flash (pytorch/pytorch#142132, torch 2.6.0.dev20241204, H100).
# --estimate.attention_backend=flash prices such a run.
CUDNN_FIRST_DEVICES = (*HOPPER_ATTENTION_DEVICES, "B200", "GB200", "B300", "GB300")  # sm90, sm100, sm103


def _hopper_at(seq: float, backward: bool, causal: bool, head_dim: int, backend: str) -> float:
    """A measured Hopper curve (head dim 64 or 128) at this sequence length (log2-linear, as _interp_on)."""
    xs, fwd, fwd_c, bwd, bwd_c = _HOPPER_CURVES[(backend, head_dim)]
    if not backward:
        return _interp_on(seq, xs, fwd_c if causal else fwd)
    if not causal:
        return _interp_on(seq, xs, bwd)
    if bwd_c is not None:
        return _interp_on(seq, xs, bwd_c)
    return _interp_on(seq, xs, bwd) * _interp_on(seq, xs, fwd_c) / _interp_on(seq, xs, fwd)


def _h100_tflops(seq: float, backward: bool, causal: bool) -> float:
    """FlashAttention-2 on an H100 at head dim 128 (FA2_H100_*): the curve the other devices' FA2 rates scale."""
    return _hopper_at(seq, backward, causal, 128, "flash")


def _between_head_dims(head_dim: float, at_64: float, at_128: float) -> float:
    """A rate measured at head dims 64 and 128, log2-interpolated to `head_dim` and clamped to the two."""
    t = min(max(math.log2(max(head_dim, 1)) - 6.0, 0.0), 1.0)
    return at_64 + t * (at_128 - at_64)


def _hopper_tflops(seq: float, backward: bool, causal: bool, head_dim: int, backend: str) -> float:
    """Hopper TFLOPS of `backend` at this head dim: between the measured head dims 64 and 128."""
    lo = _hopper_at(seq, backward, causal, 64, backend)
    hi = _hopper_at(seq, backward, causal, 128, backend)
    return _between_head_dims(head_dim, lo, hi)


def fwd_bwd_tflops(tflops_at, seq: float) -> float:
    """Forward + backward TFLOPS as FlashAttention's benchmarks count it: 3.5 forward FLOPs over both times."""
    return 3.5 / (1.0 / tflops_at(seq, False) + 2.5 / tflops_at(seq, True))


# B200: torch's SDPA on sm100 runs cuDNN attention, not FlashAttention-2 (whose mma.sync kernels sustain on a B200
# about what they do on an H100: 376 forward / 309 backward TFLOPS at 8K in the measurement below). torchtitan puts
# SDPBackend.CUDNN_ATTENTION first when has_cuda_capability(10, 0) (pytorch/torchtitan PR #1196, 2025-05-14;
# torchtitan/models/attention.py at 6fc499f), and torch prefers cuDNN on sm90/sm100 once its bundled cuDNN is newer
# than 9.15 (sdp_utils.cpp `check_prefer_cudnn_attention`, pytorch/pytorch PR #162073), so this trainer gets it too.
# Measured: NVIDIA/cudnn-frontend f937055 (2025-06-12), benchmark/sdpa_benchmark_bf16_training/artifacts/
# sdpa_benchmark_results_NVIDIA_B200.csv: one B200 (free clock), torch 2.8.0a0 nv25.05, CUDA 12.9, cuDNN 9.10.2,
# torch SDPA with the cuDNN backend (`pyt_cudnn`), bf16, head dim 128, causal, batch 1, 128 query / 8 KV heads,
# TFLOPS on the causal-halved FLOPs (backward 2.5x the forward's), as the estimator counts them. Its 128 heads give a
# call 4x the work of Llama 3 8B's 32 heads at the same length (at 8K the optimistic reading). No non-causal figure
# was published with it: non-causal attention (context parallelism's ring steps) is priced at these causal rates
# times the non-causal / causal ratio measured with one cuDNN on the part's own silicon (CUDNN919_*_NO_MASK below).
B200_ATTN_SEQ = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
B200_SDPA_CALL = (1, 128, 128)  # the benchmark's batch, query heads and head dim
B200_CUDNN_FWD_MEASURED = (66.28, 216.11, 525.475, 897.309, 1211.14, 1358.566, 1435.072, 1428.973, 1348.674)
B200_CUDNN_BWD_MEASURED = (43.512, 178.132, 383.705, 709.138, 945.44, 1074.499, 1132.387, 1074.456, 1037.897)
# Those times include the host's dispatch of the call. The benchmark (benchmark_single_sdpa.py at f937055) records a
# CUDA event, calls torch's SDPA (or `output.backward`) under autograd's emit_nvtx, records a second event and
# synchronizes, one call at a time on an idle stream: the GPU waits between the two events while the host dispatches,
# so short calls measure the host. At 512 tokens the file's three flash-type backends take 0.130 / 0.142 / 0.147 ms
# forward (cuDNN, torch's FlashAttention-2, the flash-attn package) and 0.494 / 0.514 / 0.629 ms backward, where their
# kernels need about a tenth of that. In a training step the host runs ahead of the GPU and that time is hidden, so
# the kernels' rates are the measured times less this floor. Each direction's floor is solved from two adjacent
# lengths, whose causal work differs 4x, as t = floor + work / rate with one rate for both: forward 0.120 ms (512 and
# 1024), backward 0.344 ms (1024 and 2048: the backward at 512, 0.494 ms, is not above 1024's 0.482, so its host time
# varies by more than that kernel's). The kernel curves start at 1024 (below it, proportional to the length, the
# rule for every curve); above 16K the floor is under 2 % of a call. cudnn-frontend's later benchmark (the cuDNN 9.19
# curves below and the H200's above) reads each kernel's device time from torch's profiler: no floor to remove.
# Until 2026-12-03 the measured curve was priced as it is, 0.55x the kernel's rate at 2K forward and 0.62x backward
# (docs/estimate_log.md, "The B200's attention curve without the benchmark's host time").


def _call_work(seq: float, backward: bool) -> float:
    """Causal-halved FLOPs of one call of the B200 benchmark (B200_SDPA_CALL) at this length."""
    batch, heads, head_dim = B200_SDPA_CALL
    return (2.5 if backward else 1.0) * 2.0 * batch * heads * head_dim * seq * seq


def _call_s(measured: tuple[float, ...], backward: bool) -> list[float]:
    """Seconds of each measured call (B200_ATTN_SEQ), from its TFLOPS."""
    return [_call_work(s, backward) / (tflops * 1e12) for s, tflops in zip(B200_ATTN_SEQ, measured)]


def _host_floor_s(measured: tuple[float, ...], backward: bool, i: int) -> float:
    """Seconds of host dispatch in each measured call, solved from lengths i and i + 1 (4x the work, one rate)."""
    t = _call_s(measured, backward)
    return (4.0 * t[i] - t[i + 1]) / 3.0


def _kernel_curve(measured: tuple[float, ...], backward: bool, floor_s: float) -> tuple[float, ...]:
    """The measured curve less the host floor, from 1024 tokens on (B200_KERNEL_SEQ)."""
    calls = zip(B200_ATTN_SEQ[1:], _call_s(measured, backward)[1:])
    return tuple(_call_work(seq, backward) / (t - floor_s) / 1e12 for seq, t in calls)


B200_HOST_FWD_S = _host_floor_s(B200_CUDNN_FWD_MEASURED, False, 0)
B200_HOST_BWD_S = _host_floor_s(B200_CUDNN_BWD_MEASURED, True, 1)
B200_KERNEL_SEQ = B200_ATTN_SEQ[1:]
B200_CUDNN_FWD = _kernel_curve(B200_CUDNN_FWD_MEASURED, False, B200_HOST_FWD_S)
B200_CUDNN_BWD = _kernel_curve(B200_CUDNN_BWD_MEASURED, True, B200_HOST_BWD_S)
# The GB200 (sm100 too) runs the same kernels at the B200's absolute rates, not 11 % above them as the datasheets'
# peaks would have it: Azure's AI-benchmarking-guide times FlashAttention-2 (its benchmark_flash_attention.py, head
# dim 128, batch 2 x 8192) at 373.9 TFLOPS on a GB200 and 327.9 on an H100 (x 1.14, one method), and the B200's
# FlashAttention-2 above (376 forward at 8K) is x 1.13 the H100 forward of FA2_H100_FWD_CAUSAL at 8K (333). So both
# parts take these curves as TFLOPS (attention_fraction divides by each part's own peak).
# Blackwell Ultra doubles the SFUs' exponential throughput (NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025: softmax's
# MUFU.EX2 was the attention loop's bottleneck on Blackwell). Measured with one method and one cuDNN on both racks'
# GPUs: NVIDIA/cudnn-frontend df73764 (2026-03-09), benchmark/sdpa_benchmark_training/results/gb200_919_only_cudnn/
# llama3.1_20260226_174648.csv and gb300_919_only_cudnn/llama3.1_20260226_185510.csv (cuDNN 9.19, the cudnn Python
# graph API; bf16, batch 1, 64 query / 8 KV heads, head dim 128, causal ("top_left"), 10 iterations; TFLOPS counted
# as the H200 curves above), forward and backward by sequence length. Blackwell Ultra's attention is the Blackwell
# curve in use times the GB300 / GB200 ratio of these two measurements at the same length (x 1.18 forward, x 1.06
# backward at 8K): the ratio carries the hardware's gain, the Blackwell curve the software era the estimator prices
# (cuDNN 9.10.2 there; GB200 at its own 9.19 curve, a what-if, would price the GB200 rows 5-6 points faster:
# docs/estimate_log.md). The B300 takes the GB300's ratio (the same die; no HGX B300 measurement was found).
# The same two files time each length without a mask too ("no_mask", the same graph API and heads): non-causal
# attention runs faster per FLOP than causal at short lengths (GB200: x 1.19 forward, x 1.30 backward at 2K; x 1.04 /
# 1.02 at 32K), as FlashAttention-2's non-causal kernels do on an H100 (x 1.21 forward at 2K, head dim 64, above):
# causal tiles along the diagonal do masked work, and a query tile's K loop is half as long on average. A non-causal
# call on a Blackwell part is priced at its causal rate in use times its own silicon's ratio at that length (the
# GB200's for the B200 and GB200, the GB300's for the B300 and GB300), constant outside the measured lengths.
BLACKWELL_ULTRA_SEQ = (2048, 4096, 8192, 16384, 32768)
CUDNN919_GB200_FWD_CAUSAL = (1042.0, 1335.0, 1598.0, 1687.0, 1720.0)
CUDNN919_GB200_BWD_CAUSAL = (836.0, 1132.0, 1311.0, 1402.0, 1473.0)
CUDNN919_GB300_FWD_CAUSAL = (1266.0, 1672.0, 1887.0, 1968.0, 2014.0)
CUDNN919_GB300_BWD_CAUSAL = (906.0, 1195.0, 1385.0, 1490.0, 1549.0)
CUDNN919_GB200_FWD_NO_MASK = (1245.0, 1593.0, 1709.0, 1769.0, 1781.0)
CUDNN919_GB200_BWD_NO_MASK = (1089.0, 1287.0, 1409.0, 1455.0, 1501.0)
CUDNN919_GB300_FWD_NO_MASK = (1568.0, 1872.0, 1930.0, 1992.0, 1880.0)
CUDNN919_GB300_BWD_NO_MASK = (1168.0, 1353.0, 1501.0, 1559.0, 1555.0)
BLACKWELL_ULTRA_DEVICES = ("B300", "GB300")
# Head dim: the curves above are head dim 128 (192 / 128 for the DeepSeek shapes not used here). At head dim 64 a
# Blackwell attention kernel does half the matmul work per score, but the same softmax work (MUFU.EX2, Blackwell's
# attention bottleneck, above), so it sustains fewer TFLOPS. Measured on a Blackwell part (its MFU column puts the
# peak at 2,500 TFLOPS: a GB200 or a B300), cuDNN and FlashAttention-4 timed in one table, forward, by head dim:
# Dao-AILab/flash-attention PR #2605 (2026), cuDNN non-causal at batch 32 x 1024, 979 TFLOPS at head dim 64 against
# 1,428 at 128 (the one cuDNN pair the thread shows whole). FlashAttention-4 in the same thread: non-causal
# 776 / 982 / 1,112 / 1,179 / 1,218 against 1,145 / 1,382 / 1,559 / 1,646 / 1,745 from 1K to 16K (0.68-0.72), causal
# 460 / 699 / 904 against 785 / 1,132 / 1,381 at 1K / 2K / 4K (0.59-0.65). On Hopper cuDNN's head dim 64 runs at 0.72
# of its 128 (the FlashAttention-3 paper's bars, above). So a cuDNN call on a Blackwell part at head dim 64 runs at
# BLACKWELL_CUDNN_D64_RATIO of the head-dim-128 curve at every length, forward and backward (no Blackwell backward
# pair was found: an assumption, as on Hopper, where FlashAttention-2's backward ratio, 0.90-0.92, is its forward's,
# 0.87-0.91), log2-interpolated between 64 and 128; 128 and above as measured. Until 2026-12-04 every head dim
# took the head-dim-128 curve (docs/estimate_log.md, "Blackwell's cuDNN attention at head dim 64").
BLACKWELL_CUDNN_D64_RATIO = 979.0 / 1428.0


def blackwell_ultra_attention_gain(seq: float, backward: bool) -> float:
    """GB300 / GB200 attention TFLOPS at this length (cuDNN 9.19, causal): constant below and above the measured
    lengths (both curves are proportional below their first point and flat above their last)."""
    if backward:
        ultra, base = CUDNN919_GB300_BWD_CAUSAL, CUDNN919_GB200_BWD_CAUSAL
    else:
        ultra, base = CUDNN919_GB300_FWD_CAUSAL, CUDNN919_GB200_FWD_CAUSAL
    return _interp_on(seq, BLACKWELL_ULTRA_SEQ, ultra) / _interp_on(seq, BLACKWELL_ULTRA_SEQ, base)


def blackwell_non_causal_ratio(device: str, seq: float, backward: bool) -> float:
    """Non-causal / causal cuDNN attention TFLOPS at this length on a Blackwell part (cuDNN 9.19, the GB200's
    measurement for the B200 and GB200, the GB300's for the B300 and GB300): constant below and above the measured
    lengths."""
    ultra = silicon(device) in BLACKWELL_ULTRA_DEVICES
    curves = {
        (False, False): (CUDNN919_GB200_FWD_NO_MASK, CUDNN919_GB200_FWD_CAUSAL),
        (False, True): (CUDNN919_GB200_BWD_NO_MASK, CUDNN919_GB200_BWD_CAUSAL),
        (True, False): (CUDNN919_GB300_FWD_NO_MASK, CUDNN919_GB300_FWD_CAUSAL),
        (True, True): (CUDNN919_GB300_BWD_NO_MASK, CUDNN919_GB300_BWD_CAUSAL),
    }
    no_mask, causal = curves[(ultra, backward)]
    return _interp_on(seq, BLACKWELL_ULTRA_SEQ, no_mask) / _interp_on(seq, BLACKWELL_ULTRA_SEQ, causal)


def attention_sustained_factor(device: str) -> float:
    """Sustained / measured for the device's attention curves: HOPPER_ATTENTION_SUSTAINED on Hopper,
    BLACKWELL_ATTENTION_SUSTAINED on Blackwell, else 1 (left as measured)."""
    device = silicon(device)
    if device in HOPPER_ATTENTION_DEVICES:
        return HOPPER_ATTENTION_SUSTAINED
    return BLACKWELL_ATTENTION_SUSTAINED if device in BLACKWELL_DEVICES else 1.0


def attention_backend(device: str, requested: str = "auto") -> str:
    """The SDPA backend a run on `device` uses: "cudnn" or "flash" (FlashAttention-2). auto: cuDNN on the parts
    whose datacenter compute capability torch prefers it on (sm90 Hopper, sm100 B200 / GB200, sm103 B300 / GB300),
    FlashAttention-2 elsewhere."""
    if requested != "auto":
        return requested
    return "cudnn" if silicon(device) in CUDNN_FIRST_DEVICES else "flash"


def attention_fraction(
    device: str,
    seq: float,
    backward: bool,
    causal: bool = True,
    head_dim: int = 128,
    backend: str = "auto",
) -> float:
    """Fraction of the device's bf16 datasheet peak flash attention sustains at this (per-rank) sequence length,
    with the SDPA backend `backend` (auto: attention_backend's choice for the device)."""
    backend = attention_backend(device, backend)
    device = silicon(device)
    if device in BLACKWELL_DEVICES:
        peak = GEMM_SOURCES[device].table_peak
        if backend == "cudnn":  # cuDNN attention (above), measured causal
            tflops = _interp_on(seq, B200_KERNEL_SEQ, B200_CUDNN_BWD if backward else B200_CUDNN_FWD)
            if device in BLACKWELL_ULTRA_DEVICES:
                tflops *= blackwell_ultra_attention_gain(seq, backward)
            if not causal:
                tflops *= blackwell_non_causal_ratio(device, seq, backward)
            return tflops * _between_head_dims(head_dim, BLACKWELL_CUDNN_D64_RATIO, 1.0) / peak
        # FA2's mma.sync kernels: about the H100's TFLOPS, at the run's head dim as on Hopper (the same kernels run
        # 0.87-0.90 as fast at head dim 64 as at 128; until 2026-12-03 the head-dim-128 curve at every head dim)
        return _hopper_tflops(seq, backward, causal, head_dim, "flash") / peak
    if device in HOPPER_ATTENTION_DEVICES:
        return _hopper_tflops(seq, backward, causal, head_dim, backend) / 989.0
    if device == "MI355X":
        curves = {(False, True): SDPA_MI355X_FWD_CAUSAL, (False, False): SDPA_MI355X_FWD,
                  (True, True): SDPA_MI355X_BWD_CAUSAL, (True, False): SDPA_MI355X_BWD}  # fmt: skip
        return _interp_on(seq, SDPA_MI355X_SEQ, curves[(backward, causal)]) / GEMM_SOURCES[device].table_peak
    if device in ("A100", "A100 40GB"):
        # the H100's FA2 curves at this head dim, scaled to FA2's own A100 forward + backward at that head dim
        d64, d128 = _interp(seq, FA2_A100_FWDBWD_CAUSAL_D64), _interp(seq, FA2_A100_FWDBWD_CAUSAL)
        h100 = fwd_bwd_tflops(lambda x, b: _hopper_tflops(x, b, True, head_dim, "flash"), seq)
        a100 = _between_head_dims(head_dim, d64, d128)
        return (
            _hopper_tflops(seq, backward, causal, head_dim, "flash")
            * (a100 / h100)
            / gemm_source(device)[0].table_peak
        )
    frac = _h100_tflops(seq, backward, causal) / 989.0
    if device == "MI300X":
        if backward:
            frac *= (FA2_MI300X_BWD_16K / MI300X_PEAK) / (FA2_H100_BWD[-1] / 989.0)
        else:
            frac *= (FA2_MI300X_FWD_16K / MI300X_PEAK) / (FA2_H100_FWD[-1] / 989.0)
    return frac


# ------------------------------------------------------------------------------------------- memory-bound kernels
# Eager RMSNorm: torch.nn.functional.rms_norm's fused CUDA kernels (torch >= 2.9, pytorch/pytorch#153666; what
# `--estimate.eager_rms_norm=fused` prices), timed by NVIDIA/cudnn-frontend (df73764, 2026-03-09)
# benchmark/norms/results/{h200,gb200,gb300}/all_models_2026022*.csv: the "pytorch" backend in the
# nvcr.io/nvidia/pytorch:25.12-py3 container, bf16, the L2 flushed before each of 20 iterations, the median device
# time of the forward and of the backward (input and weight gradients) under the profiler; GB/s on the minimal bytes
# (forward: x read, y written; backward: x and dy read, dx written; the weight and the fp32 rstd besides), which are
# the bytes steptime.elementwise_bytes counts for a fused norm. At the Llama 3 8B / 70B / 405B shapes (N x C =
# 16384 x 4096, 8192 x 8192, 4096 x 16384). The backward runs at about half the forward's rate (its weight gradient
# is a second reduction over the rows; cuDNN's own kernel in the same files reaches 3,801 GB/s on the H200 at the
# 8B shape, torch's 1,807), and both fall with the width.
EAGER_RMS_NORM_WIDTHS = (4096, 8192, 16384)
EAGER_RMS_NORM_GBPS = {  # measured part: ((forward GB/s by width), (backward GB/s by width))
    "H200": ((3364.5, 2627.6, 2395.9), (1807.3, 1548.0, 1542.0)),
    "GB200": ((5341.4, 5000.1, 3799.9), (2266.9, 2269.5, 2036.5)),
    "GB300": ((5466.4, 5122.3, 3882.5), (2329.4, 2333.7, 2073.7)),
}
# Each part takes its measured sibling's fraction of the table's bandwidth (the H200's 4.8 TB/s, the GB200's 7,928
# GB/s, the GB300's 8 TB/s): the Hopper parts the H200's, the B200 the GB200's, the B300 the GB300's; other parts keep
# Efficiency.hbm (no measurement).
EAGER_RMS_NORM_SOURCE = {
    **{d: "H200" for d in HOPPER_ATTENTION_DEVICES},
    "B200": "GB200",
    "GB200": "GB200",
    "B300": "GB300",
    "GB300": "GB300",
}


def eager_rms_norm_fraction(device: str, width: float, backward: bool) -> float | None:
    """Fraction of the hardware table's memory bandwidth torch's fused eager RMSNorm sustains on `device` at this norm
    width (log2-interpolated between the measured widths, constant outside); None where no sibling was measured."""
    measured = EAGER_RMS_NORM_SOURCE.get(silicon(device))
    if measured is None:
        return None
    lo, hi = EAGER_RMS_NORM_WIDTHS[0], EAGER_RMS_NORM_WIDTHS[-1]
    width = min(max(width, lo), hi)
    gbps = _interp_on(width, EAGER_RMS_NORM_WIDTHS, EAGER_RMS_NORM_GBPS[measured][1 if backward else 0])
    return gbps / device_spec(measured).hbm_gbps


# SwiGLU over the two strided halves of one fused gate/up linear's output (`--estimate.swiglu=split`: nanotron's
# GLUActivation, `silu(gate) * up` after torch.split): linkedin/Liger-Kernel's benchmark data (ead96b61,
# benchmark/data/all_benchmark_data.csv, 2026-07-26, `triton.testing.do_bench` median), provider `megatron_swiglu`
# (torch's eager `silu(y1) * y2` over torch.chunk of a [2048, 4, 2 x ffn] bf16 tensor, 10 bytes an element of ffn) on
# an NVIDIA H100 80GB HBM3: 1,752-1,789 GB/s forward, 0.52-0.53 of its 3,352 GB/s, where contiguous eager kernels on
# the same part sustain 0.75-0.86 (Efficiency.hbm's check). The forward's fraction, taken for the backward too (an
# assumption: its gradients are written into the same strided halves); on every part, as a fraction of its bandwidth.
STRIDED_SWIGLU_FRACTION = 0.525

# FSDP2's copies around its collectives (steptime.fsdp_copies), as fractions of the part's memory bandwidth:
# measured by scripts/fsdp_copy_rates.py on three traced steps of one simulated rank of torchtitan's 8B FSDP 8
# (seq 4096, batch 1: no AC eager, full AC eager, full AC float8 + compile; docs/performance.md, command f, on an
# H200, torch 2.11, 2026-12-04). The gather copy-in (the shard's fp32 -> bf16 cast and its copy into the flat send
# buffer, 280 foreach kernels a step, 19.4 GB) reached 0.298 / 0.301 / 0.361 of the H200's 4,800 GB/s; the reduce
# copy-in (_chunk_cat of the bf16 gradients into the fp32 send buffer, 48.2 GB) 0.398 / 0.406 / 0.421; the copy-out
# (split_with_sizes_copy, 62.1 GB) 0.814 / 0.823 / 0.823, the elementwise rate (Efficiency.hbm 0.80). The medians;
# on every part as a fraction of its bandwidth (an assumption: one part measured).
FSDP_GATHER_COPY_IN_FRACTION = 0.301
FSDP_REDUCE_COPY_IN_FRACTION = 0.406
# The gather copy-in runs on FSDP2's own copy-in stream beside the compute (steptime.fsdp_gather_copy_in): what it
# costs the compute it overlaps, as a fraction of the copy-in's own time, measured by scripts/fsdp_copy_rates.py
# (`beside_compute`: each compute-stream kernel it overlaps against the median of the same kernel at the same shapes
# that nothing overlapped) on the same three traces: 0.140 / 0.157 / 0.090. The median.
FSDP_GATHER_COPY_IN_CONTENTION = 0.140

# torch's CUDA copy from bf16 to fp32 (a dtype-converting aten::copy_: `.float()`, the gradient of `.type_as()` from
# fp32, autocast's cast to fp32) runs an unrolled, non-vectorized elementwise kernel that converts each element through
# dynamic-cast loads and stores; the reverse copy is vectorized (pytorch/pytorch#137053, 2024-10, named for H100+:
# aten/src/ATen/native/cuda/Copy.cu sends every fp32 -> bf16 / fp16 copy to gpu_kernel_nocast, on every part). Measured by scripts/cast_rates.py on the no-AC and full-AC eager traces above (8B at
# 1 x 4096, the kernels no other stream overlapped): RoPE's upcast of q (4096 x 32 x 128) at 0.382 / 0.385 and of k
# (4096 x 8 x 128) at 0.402 / 0.349 of the H200's 4,800 GB/s, where its downcasts reach 0.85-0.86 (q) and the
# elementwise rate. The median of the four:
EAGER_UPCAST_FRACTION = 0.383
# The kernel is bound by its instructions, not by the memory: it moves a fixed number of bytes per SM and clock,
# 0.383 x 4,800 GB/s over the H200's 132 SMs at 1,980 MHz = 7.03. Checked, set on nothing, on two other parts with
# the same unrolled path: an A100 converting 67,108,864 bf16 elements to fp32 in 362.46 us (pytorch/pytorch#195542,
# 2026-09, its "control"), 1,111 GB/s where 108 SMs x 1,410 MHz x 7.03 give 1,071 (-3.6 %; 0.55 of an 80 GB A100's
# bandwidth, not 0.38); a power-limited H100 PCIe converting 536,870,912 fp32 elements to fp16 in 2.225 ms before
# #137053 vectorized that direction, 1,448 GB/s where 114 SMs x 1,755 MHz x 7.03 give 1,407 (-2.8 %; 0.71 of its 2 TB/s).
# So a part's upcast rate is min(the elementwise rate, 7.03 x its SMs x its SM clock: the boost clock, or the clock
# it is locked at); parts whose boost clock is not listed here keep the H200's fraction of their bandwidth (an
# assumption; ROCm's own vectorized upcast, pytorch/pytorch#163869, 2025-09, is not separated out).
EAGER_UPCAST_BYTES_PER_SM_CYCLE = EAGER_UPCAST_FRACTION * 4800e9 / (132 * 1980e6)
# Boost SM clocks (MHz): the parts of LOCKABLE_CLOCK (the 700 W Hopper parts and the B200; the H800 and GH200 take
# their twin's); A100 1,410 (NVIDIA's A100 architecture whitepaper, "GPU Boost Clock"); H100 PCIe 1,755 (NVIDIA's H100
# PCIe product brief, "max boost clock"). The GB200, B300 and GB300 take the B200's (an assumption: the same 148-SM
# die family).
BOOST_CLOCK_MHZ = {
    **{d: boost for d, (boost, _) in LOCKABLE_CLOCK.items()},
    "A100": 1410.0,
    "A100 40GB": 1410.0,
    "H100 PCIe": 1755.0,
    **{d: LOCKABLE_CLOCK["B200"][0] for d in BLACKWELL_DEVICES},
}


def eager_upcast_gbps(device: str, sm_clock_mhz: float | None = None, hbm_gbps: float | None = None) -> float:
    """GB/s torch's unrolled bf16 -> fp32 copy sustains on `device`: EAGER_UPCAST_BYTES_PER_SM_CYCLE x its SMs x
    its clock (`sm_clock_mhz` where locked, else the boost clock); where the boost clock is not known,
    EAGER_UPCAST_FRACTION of the part's bandwidth (`hbm_gbps`, default the hardware table's)."""
    boost = BOOST_CLOCK_MHZ.get(silicon(device))
    if boost is None:
        return EAGER_UPCAST_FRACTION * (hbm_gbps or device_spec(device).hbm_gbps)
    return EAGER_UPCAST_BYTES_PER_SM_CYCLE * gemm_source(device)[0].sms * (sm_clock_mhz or boost) * 1e6 / 1e9
