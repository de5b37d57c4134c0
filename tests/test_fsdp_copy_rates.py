"""FSDP2's own copies timed in a CUDA trace (scripts/fsdp_copy_rates.py) and the estimator's pricing of them
(steptime.fsdp_copies, rates.FSDP_*_COPY_IN_FRACTION): the script on a trace written by hand, so every byte and
microsecond is known; the estimator's bytes against the ones the script counted in the H200 traces the fractions
come from (docs/performance.md, command f)."""

import json
import statistics

import pytest

from conftest import import_script
from torchtitan.config import parse_args
from torchtitan.estimate import rates, steptime
from torchtitan.estimate.plan import build_plan

RATES = import_script("fsdp_copy_rates")


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat, "args": args}


def _launch(ts, corr, kernel_ts, dur, kernel):
    return [_x("cudaLaunchKernel", ts, 1, cat="cuda_runtime", correlation=corr),
            _x(kernel, kernel_ts, dur, cat="kernel", tid=7, correlation=corr)]  # fmt: skip


def _trace(tmp_path):
    shard = [[1000], [500]]  # two parameters' shards: 1,500 elements
    events = [
        _x("ProfilerStep#7", 0, 10_000, cat="user_annotation"),
        _x("FSDP::all_gather (layers.0)", 100, 400, cat="user_annotation"),
        _x("aten::_foreach_copy_", 110, 50, **{"Input Dims": [shard, shard, []]}),  # the fp32 -> bf16 cast
        *_launch(
            120,
            1,
            1000,
            3,
            "void multi_tensor_apply_kernel<TensorListMetadata<2>, CopyFunctor<c10::BFloat16, float, 2, 1, 1>>",
        ),
        _x("fsdp::all_gather_copy_in", 200, 100, cat="user_annotation"),
        _x("aten::_foreach_copy_", 210, 50, **{"Input Dims": [shard, shard, []]}),  # into the flat buffer
        *_launch(
            220,
            2,
            1010,
            2,
            "void multi_tensor_apply_kernel<TensorListMetadata<2>, UnaryOpFunctor<c10::BFloat16, 2, 1, 1>>",
        ),
        _x("FSDP::all_gather_copy_out (layers.0)", 600, 100, cat="user_annotation"),
        _x(
            "aten::split_with_sizes_copy",
            610,
            80,
            **{"Input Dims": [[8, 1500], [], [], []], "Input type": ["c10::BFloat16", "", "", ""]},
        ),
        *_launch(620, 3, 1020, 5, "split_with_sizes_copy_out_contiguous_no_cast_kernel(char**)"),
        _x("aten::_chunk_cat", 2000, 100, **{"Input Dims": [[[4000, 2], [4000]], [], [], [8, 1500]]}),
        *_launch(2010, 4, 3000, 10, "void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>"),
        _x("Optimizer.step#AdamW.step", 5000, 100, cat="user_annotation"),
        _x("aten::_foreach_copy_", 5010, 50, **{"Input Dims": [shard, shard, []]}),  # not FSDP's
        *_launch(5020, 5, 6000, 7, "void multi_tensor_apply_kernel<CopyFunctor<float, float, 2, 1, 1>>"),
        _x("aten::_chunk_cat", 20_000, 100, **{"Input Dims": [[[4000]], [], [], [8, 500]]}),  # after the step
        *_launch(
            20_010, 6, 21_000, 10, "void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>"
        ),
    ]
    p = tmp_path / "rank0_step7.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_sums_each_kind_by_its_ops_kernels_and_dtypes(tmp_path):
    got = RATES.copy_rates(_trace(tmp_path))
    assert got["gather_copy_in"] == {
        "kernels": 2,
        "seconds": pytest.approx(5e-6),
        "bytes": 1500 * (2 + 4) + 1500 * 4,
    }
    assert got["copy_out"] == {"kernels": 1, "seconds": pytest.approx(5e-6), "bytes": 8 * 1500 * 4}
    assert got["reduce_copy_in"] == {"kernels": 1, "seconds": pytest.approx(10e-6), "bytes": 12_000 * (4 + 2)}


def test_beside_compute_gives_the_compute_streams_excess_to_the_copy_in_that_overlapped_it(tmp_path):
    """The gather copy-in on its own stream (tid 14) beside the compute stream (tid 7): a compute kernel it overlaps
    ran 13 us where its twin (the same kernel at the same shapes) ran 10 alone, and the compute stream then waited
    7 us while the copy-in went on; a kernel overlapped by a copy-in and by another stream (tid 18) gives the copy-in
    its share of the excess, by overlap."""
    shard = {"Input Dims": [[[1000]], [[1000]], []]}
    shapes = {"Input Dims": [[4, 4], [4, 4]]}
    copy_in = "multi_tensor_apply_kernel<CopyFunctor<c10::BFloat16, float>>"
    events = [_x("ProfilerStep#7", 0, 10_000, cat="user_annotation")]
    for unit, (ts, corr, kernel_ts, dur) in enumerate(((100, 1, 1000, 20), (1150, 5, 2004, 6))):
        events += [
            _x(f"FSDP::all_gather (layers.{unit})", ts, 100, cat="user_annotation"),
            _x("aten::_foreach_copy_", ts + 10, 50, **shard),
            _x("cudaLaunchKernel", ts + 20, 1, cat="cuda_runtime", correlation=corr),
            _x(copy_in, kernel_ts, dur, cat="kernel", tid=14, correlation=corr),
        ]
    for ext, (ts, corr, kernel_ts, dur) in zip((11, 12, 13), ((600, 2, 700, 10), (900, 3, 1000, 13),
                                                             (1300, 4, 2000, 14))):  # fmt: skip
        events += [
            _x("aten::mul", ts, 20, **{"External id": ext, **shapes}),
            _x("cudaLaunchKernel", ts + 5, 1, cat="cuda_runtime", correlation=corr),
            _x("mul_kernel", kernel_ts, dur, cat="kernel", tid=7, correlation=corr, **{"External id": ext}),
        ]
    events.append(_x("Memcpy DtoD", 2000, 12, cat="gpu_memcpy", tid=18))
    p = tmp_path / "rank0_step7.json"
    p.write_text(json.dumps({"traceEvents": events}))
    got = RATES.beside_compute(p)
    assert got["copy_in"] == pytest.approx(26e-6)
    assert got["idle"] == pytest.approx(7e-6)
    assert got["excess"] == pytest.approx(3e-6 + 4e-6 * 6 / (6 + 12))


def test_command_prints_rates_and_rejects_a_cpu_trace(tmp_path, capsys):
    assert RATES.main([str(_trace(tmp_path)), "--peak-gbps", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    reduce = next(line for line in out if line.startswith("reduce_copy_in")).split()
    assert reduce[1:] == ["1", "0.00", "0.01", "7", "0.072"]  # 72,000 bytes in 10 us: 7.2 GB/s of 100
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [_x("ProfilerStep#1", 0, 10, cat="user_annotation")]}))
    assert RATES.main([str(cpu)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(cpu) in err[0] and "no CUDA kernels" in err[0]


def _copies(*flags):
    """The traced configuration (8B, FSDP 8, 1 x 4096, no AC) on the table's H200, with `flags`: its plan and the
    seconds of FSDP2's copies on rank 0 in one step: those on the compute stream (steptime.fsdp_copies) and the
    gather copy-ins beside it (steptime.fsdp_gather_copy_in: forward, and again for backward but the head's)."""
    cfg = parse_args(["--job.config_file=train_configs/debug_model.toml", "--model.flavor=8B",
                      "--training.seq_len=4096", "--training.local_batch_size=1", "--activation_checkpoint.mode=none",
                      "--estimate.hardware=h200", "--estimate.num_devices=8", *flags])  # fmt: skip
    plan = build_plan(cfg)
    ci = steptime.fsdp_gather_copy_in(plan)
    gather_in = 2 * (plan.args.n_layers * ci["block"] + ci["emb"]) + ci["head"]
    return plan, steptime.fsdp_copies(plan, steptime.Rates(plan), 0) + gather_in


# scripts/fsdp_copy_rates.py on the three traces of docs/performance.md command f (one simulated rank of the 8B at
# FSDP 8, seq 4096, batch 1, on an H200: no AC eager, full AC eager, full AC float8 + compile): GB and ms per kind
H200_TRACES = {
    "gather_copy_in": (19.42, (13.45, 13.59, 11.20)),
    "copy_out": (62.14, (15.72, 15.90, 15.73)),
    "reduce_copy_in": (48.18, (24.75, 25.24, 23.87)),
}


# and `beside_compute` on them: ms of the compute stream's excess beside the gather copy-in
H200_EXCESS_BESIDE_COPY_IN = (1.88, 2.14, 1.01)


def test_fractions_are_the_measured_medians_and_the_estimator_counts_the_traced_bytes():
    peak = 4800e9  # the hardware table's H200
    for kind, constant in (("gather_copy_in", rates.FSDP_GATHER_COPY_IN_FRACTION),
                           ("reduce_copy_in", rates.FSDP_REDUCE_COPY_IN_FRACTION)):  # fmt: skip
        gb, ms = H200_TRACES[kind]
        assert constant == pytest.approx(statistics.median(gb * 1e9 / (t / 1e3) / peak for t in ms), abs=1e-3)
    contention = statistics.median(
        x / t for x, t in zip(H200_EXCESS_BESIDE_COPY_IN, H200_TRACES["gather_copy_in"][1])
    )
    assert rates.FSDP_GATHER_COPY_IN_CONTENTION == pytest.approx(contention, abs=1e-3)
    plan, copies = _copies()  # the traced configuration, on the table's H200
    # each kind's bytes at its rate, from the traced byte counts: the estimator's accounting must give the same
    want = (H200_TRACES["gather_copy_in"][0] / rates.FSDP_GATHER_COPY_IN_FRACTION / peak
            + H200_TRACES["copy_out"][0] / steptime.Rates(plan).hbm
            + H200_TRACES["reduce_copy_in"][0] / rates.FSDP_REDUCE_COPY_IN_FRACTION / peak) * 1e9  # fmt: skip
    assert copies == pytest.approx(want, rel=0.01)
    # and the step's measured copies (the no-AC trace's 53.9 ms) within 5 %
    measured = sum(ms[0] for _, ms in H200_TRACES.values()) / 1e3
    assert copies == pytest.approx(measured, rel=0.05)


def test_the_gather_copy_in_casts_only_what_is_wider_than_it_gathers():
    """fp32 master weights are cast to bf16 before each gather (4 + 2 bytes per shard element, at the gather copy-in's
    rate); a bf16 model gathers its parameters as they are; with the float8 all-gather the converted linears are
    gathered as 1 byte and their cast is a float8 cast (priced with the float8 casts): nothing of a block is cast
    here, the embedding and the head still are."""
    plan, fp32 = _copies()
    _, bf16 = _copies("--estimate.model_dtype=bfloat16")
    peak = plan.hw.hbm_gbps * 1e9
    gather_in = rates.FSDP_GATHER_COPY_IN_FRACTION * peak
    blocks, emb, head = plan.args.n_layers * plan.block_params(), plan.embedding_params(), plan.head_params()
    # forward, and again for backward: blocks and embedding reshard after forward, the head stays gathered
    cast_elements = (2 * blocks + 2 * emb + head) / 8
    assert fp32 - bf16 == pytest.approx(cast_elements * (4 + 2) / gather_in, rel=1e-9)

    plan8, f8 = _copies("--float8.enable=true", "--float8.enable_fsdp_float8_all_gather=true")
    share = sum(lin.in_features * lin.out_features for lin in plan8.block_linears if lin.float8) / sum(
        lin.in_features * lin.out_features for lin in plan8.block_linears
    )
    assert share == 1  # every block linear converted (the share is of the linears' parameters)
    gb = share * 1 + (1 - share) * 2  # a block's gathered bytes per parameter
    gathered = 2 * blocks * gb + 2 * emb * 2 + head * 2
    cast = (2 * blocks * (1 - share) + 2 * emb + head) * (4 + 2) / 8
    reduce_in = (blocks + emb + head) * (2 + 4) / (rates.FSDP_REDUCE_COPY_IN_FRACTION * peak)
    want = 2 * gathered / steptime.Rates(plan8).hbm + (cast + 2 * gathered / 8) / gather_in + reduce_in
    assert f8 == pytest.approx(want, rel=1e-9)
