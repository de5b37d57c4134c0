"""The wait for the slowest GPU (torchtitan/estimate/stragglers.py; source and derivation there)."""

from __future__ import annotations

import math

import pytest

from torchtitan.config import parse_args
from torchtitan.estimate import stragglers
from torchtitan.estimate.training import estimate_training


def test_expected_max_of_normal_samples():
    assert stragglers.expected_max(1) == 0.0
    assert stragglers.expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-5)  # closed form
    assert stragglers.expected_max(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-5)  # closed form
    # tabulated: d2(8) = 2.847 is the expected range of 8 samples; E[max of 1000] = 3.241
    assert 2 * stragglers.expected_max(8) == pytest.approx(2.847, abs=5e-4)
    assert stragglers.expected_max(1000) == pytest.approx(3.2414, abs=5e-4)


def test_sigma_follows_a_five_percent_range_on_eight_gpus():
    assert stragglers.sigma() == pytest.approx(0.05 / 2.847, rel=1e-3)


def _est(devices: int, hardware: str = "h100-sxm") -> dict:
    return estimate_training(
        parse_args(
            ["--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=2",
             f"--estimate.hardware={hardware}", f"--estimate.num_devices={devices}"]
        )
    )  # fmt: skip


def test_straggler_term_grows_with_the_job_and_is_absent_on_one_gpu():
    one, eight, many = _est(1), _est(8), _est(128)
    assert one["step_time_breakdown_s"]["straggler"] == 0.0
    share = [
        x["step_time_breakdown_s"]["straggler"]
        / (x["step_time_breakdown_s"]["compute"] + x["step_time_breakdown_s"]["recompute"])
        for x in (eight, many)
    ]
    assert share[0] == pytest.approx(stragglers.sigma() * stragglers.expected_max(8))
    assert share[1] == pytest.approx(stragglers.sigma() * stragglers.expected_max(128))
    assert share[1] > share[0] > 0
