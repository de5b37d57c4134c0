"""Synchronous training waits for its slowest GPU (docs/estimate.md, "Stragglers").

GPUs of one model do not run at one speed. Stas Bekman, Machine Learning Engineering (stas00/ml-engineering, commit
744d01e, compute/accelerator/README.md): "other accelerators are likely to perform slightly differently. I have
seen 5% and higher differences on an 8-gpu node", and "on the same 8-GPU node you can see 5%+ MAMF spread between
GPUs even when all of them pass the same factory binning" (boost clocks and power limits binned conservatively,
uneven cooling). The estimator's compute rates (rates.py) are what one GPU sustains; a job of N GPUs runs at the
pace of the slowest of them.

Model: each GPU's time for the same compute is t (1 + sigma z), z standard normal. A spread (range) of 5 % among 8
GPUs is the expected range of 8 normal samples, E[max of 8] - E[min of 8] = 2 E[max of 8] = 2.847 sigma (the
control-chart constant d2(8) = 2.847), so sigma = 0.05 / 2.847 = 1.76 %. The job waits for E[max of N] =
expected_max(N) sigma more than one GPU's compute.

Per step, not per layer: the spread the source describes comes from the chip and its cooling, a property of each
GPU that lasts, so the GPU that is slowest at one FSDP all-gather is the slowest at the next one and at the step's
last reduce-scatter and gradient-norm all-reduce: the whole step's synchronised compute runs at its pace, once.
(Independent per-kernel noise would give the same expected maximum per synchronisation point and a smaller one for
a whole step; the lasting reading is the conservative one.) Communication and the optimizer run at the fabric's
and HBM's pace and are left alone.
"""

from __future__ import annotations

import math
from functools import cache

from .plan import Plan

GPU_SPREAD_8 = 0.05  # range of sustained matmul throughput among the 8 GPUs of one node (source above)
SPREAD_SAMPLE = 8


@cache
def expected_max(n: int) -> float:
    """E[max of n independent standard normal samples], by numerical integration of x n phi(x) Phi(x)^(n-1)
    (the density of the largest of n samples; e.g. 1.4236 for n = 8, 2.5946 for 128, 3.9714 for 16384)."""
    if n <= 1:
        return 0.0
    # The trapezoid rule on a smooth integrand that vanishes at both ends converges geometrically: 500 steps agree
    # with 20,000 to 3e-14 for n = 2 .. 10^6 (measured); 1,000 cost ~2 ms, 20,000 cost 40 ms per n on a 2-core VM.
    lo, hi, steps = -8.0, 8.0 + math.sqrt(2 * math.log(n)), 1000
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        upper = 0.5 * math.erfc(x / math.sqrt(2))  # 1 - Phi(x), accurate in the tail
        log_cdf = math.log1p(-upper) if upper < 1.0 else -math.inf
        dens = n * math.exp(-0.5 * x * x + (n - 1) * log_cdf) / math.sqrt(2 * math.pi)
        total += (0.5 if i in (0, steps) else 1.0) * x * dens
    return total * h


def sigma() -> float:
    """Standard deviation of one GPU's compute time, as a share of it."""
    return GPU_SPREAD_8 / (2 * expected_max(SPREAD_SAMPLE))


def straggler_share(plan: Plan) -> float:
    """Extra share of the step's synchronised compute that waiting for the slowest of the job's GPUs costs."""
    n = plan.cfg.estimate.num_devices
    if plan.hw.is_cpu or n <= 1:
        return 0.0
    return sigma() * expected_max(n)
