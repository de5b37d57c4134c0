"""`--estimate.search`: every layout of the model on num_devices devices that fits, fastest first.

Searched: tensor parallel (powers of 2 within a node), pipeline parallel (powers of 2, 1F1B and interleaved
1F1B with 2 stages per rank, micro-batches of one sequence), context parallel (powers of 2 up to 8, for
sequences of 16K tokens or more), HSDP (replicas across nodes with FSDP inside a node) or FSDP, activation
checkpointing (none / selective op / full) and the local batch (1 to 32; a set training.global_batch_size is kept,
gradient accumulation making up the rest). Everything else (compile, float8, dtypes, seq_len) is the config's.
Each candidate goes through the trainer's own checks (ParallelDims.validate, plan_pipeline): a layout the
trainer would reject is never proposed.
"""

from __future__ import annotations

import copy
import itertools

from torchtitan.errors import UserError

from .plan import Calibration, build_plan
from .training import estimate_plan

LOCAL_BATCHES = (1, 2, 4, 8, 16, 32)
AC_MODES = (("none", "op"), ("selective", "op"), ("full", "op"))
CP_MIN_SEQ = 16384


def _powers(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def candidates(cfg):
    """Config copies, one per layout to try."""
    est, n = cfg.estimate, cfg.estimate.num_devices
    from .plan import resolve_hardware

    per_node = resolve_hardware(est, require_rates=False).devices_per_node
    cps = [c for c in _powers(8) if cfg.training.seq_len >= CP_MIN_SEQ or c == 1]
    for tp, pp, cp in itertools.product(_powers(per_node), _powers(n), cps):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        inner = max(1, per_node // (tp * cp))  # FSDP inside a node, replicas across nodes
        replicas = {1} | ({dp // inner} if dp % inner == 0 and dp > inner else set())
        schedules = [("1F1B", 1), ("Interleaved1F1B", 2)] if pp > 1 else [("1F1B", 1)]
        for dr, (sched, v), (ac, opt), lbs in itertools.product(replicas, schedules, AC_MODES, LOCAL_BATCHES):
            c = copy.deepcopy(cfg)
            p = c.parallelism
            p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree = tp, pp, cp
            p.data_parallel_replicate_degree, p.data_parallel_shard_degree = dr, -1
            p.pipeline_parallel_schedule, p.pipeline_parallel_stages_per_rank = sched, v
            p.pipeline_parallel_microbatch_size = 1
            p.pipeline_parallel_split_points = []
            c.activation_checkpoint.mode, c.activation_checkpoint.selective_ac_option = ac, opt
            c.training.local_batch_size = lbs
            yield c


def search(cfg, calibration: Calibration | None = None) -> list[dict]:
    """Estimates of every fitting layout, fastest (tokens/s per device) first."""
    results, refused, built = [], None, False
    for c in candidates(cfg):
        try:
            plan = build_plan(c, calibration)
        except UserError as e:
            refused = refused or e
            continue  # a layout the trainer rejects (divisibility, pipeline, tied embeddings ...)
        built = True
        r = estimate_plan(plan)
        if r["fits"]:
            results.append(r)
    if not built and refused is not None:  # not one layout could be planned: say why, not "none fits"
        raise UserError(
            f"search: every layout of {cfg.estimate.num_devices} devices was refused, the first: {refused}"
        )
    results.sort(key=lambda r: -r["tokens_per_sec_per_device"])
    return results


def layout_flags(r: dict) -> str:
    """The command-line overrides that select a searched layout."""
    lay = r["layout"]
    flags = [
        f"--parallelism.data_parallel_replicate_degree={lay['dp_replicate']}",
        f"--parallelism.tensor_parallel_degree={lay['tp']}",
        f"--parallelism.pipeline_parallel_degree={lay['pp']}",
        f"--parallelism.context_parallel_degree={lay['cp']}",
        f"--training.local_batch_size={lay['local_batch_size']}",
    ]
    if lay["pp"] > 1:
        flags += [f"--parallelism.pipeline_parallel_schedule={lay['pp_schedule']}",
                  "--parallelism.pipeline_parallel_microbatch_size=1"]  # fmt: skip
        if lay["pp_schedule"] != "1F1B":
            flags.append("--parallelism.pipeline_parallel_stages_per_rank=2")
    mode = lay["ac_mode"].split(":")[0]
    flags.append(f"--activation_checkpoint.mode={mode}")
    if mode == "selective":
        flags.append("--activation_checkpoint.selective_ac_option=op")
    return " ".join(flags)
