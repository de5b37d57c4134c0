"""The estimator against published runs: read tests/estimate_reference.toml, estimate every row, report errors,
in-sample and cross-validated (leave one source out).

Shared by tests/test_estimate_validation.py (the goals) and scripts/estimate_validation.py (the tables in
docs/estimate.md), so both evaluate exactly the same configurations.

Cross-validation: a constant listed in FITTED (an Efficiency field, the quantities whose rows it moves, the values
tried) is chosen on the reference rows of those quantities by minimising their median absolute error. For each
source (one published table) `cross_validated` chooses every fitted constant on the rows of the OTHER sources only
and reports that source's rows with them; the goal applies to these errors. Every rate of training comes from a
published microbenchmark, a datasheet or a stated physical rule (rates.py, efficiency.py); one constant of
decode has no source and is fitted here: `decode_layer_overhead_us`, chosen on the decode rows. The shipped value
is its fit on every source (the in-sample table); a source with decode rows is estimated with the value fitted
without it, every other source's cross-validated errors equal its in-sample ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
from pathlib import Path

from torchtitan.config import parse_args
from torchtitan.errors import UserError
from torchtitan.models import model_args_from_config

from .efficiency import DEFAULT, Efficiency
from .inference import estimate_inference, inference_hardware
from .memory import rank_memory, rest_ratio, scale_peak, state_gib
from .plan import GIB, Calibration, build_plan
from .search import AC_MODES, LOCAL_BATCHES
from .training import estimate_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "estimate_reference.toml"

# the compared quantities other than training's (TRAINING_QUANTITIES, below), as table() names them
DECODE_QUANTITY = "decode tokens/s"
STEP_TIME, MAX_RSS = CPU_QUANTITIES = ("step time s", "max RSS GiB")


@dataclasses.dataclass(frozen=True)
class Fit:
    """A constant chosen on reference rows: the compared quantities it moves (it is chosen on their rows only, as
    `table` names them) and the values tried, in the unit of the Efficiency field."""

    quantities: tuple[str, ...]
    grid: tuple[float, ...]


# Constants chosen on the reference rows (Efficiency field -> Fit). The decode step's fixed time per layer (kernel
# tails and gaps under CUDA graphs, docs/estimate.md "Rates and constants") has no published measurement; tried
# from 20 to 90 us in 5 us steps (the shipped DEFAULT is the value chosen on every source; a test checks it).
FITTED: dict[str, Fit] = {
    "decode_layer_overhead_us": Fit((DECODE_QUANTITY,), tuple(float(v) for v in range(20, 95, 5))),
}


def load_reference(path: Path = REFERENCE) -> dict:
    return tomllib.loads(Path(path).read_text())


def training_cfg(ref: dict, row: dict):
    argv = list(row["args"])
    for key, value in ref["parts"].get(row.get("part", ""), {}).items():
        argv.append(f"--estimate.{key}={value}")
    argv.append(f"--estimate.num_devices={row['num_devices']}")
    argv += [*ref.get("source_estimate_args", {}).get(row["source"], []), *row.get("estimate_args", [])]
    if "total_tokens" in row:
        argv.append(f"--estimate.total_tokens={row['total_tokens']}")
    return parse_args(argv)


def training_estimate(ref: dict, row: dict, eff: Efficiency = DEFAULT) -> dict:
    if row.get("tuned"):
        return tuned_estimate(ref, row, eff)
    return estimate_plan(build_plan(training_cfg(ref, row), eff=eff))


def allocated_peak_gib(ref: dict, row: dict, estimate: dict, eff: Efficiency = DEFAULT) -> float:
    """The estimate's peak of torch's allocated memory, for a row that publishes max_memory_allocated
    (`memory_allocated_gib`): the peak's parts less the caching allocator's overhead (fragmentation and pools,
    memory.rank_memory), on the row's `memory_pipeline_rank`, else the worst one."""
    rank = row.get("memory_pipeline_rank", estimate["peak_pipeline_rank"] or 0)
    parts = rank_memory(build_plan(training_cfg(ref, row), eff=eff), rank)
    return (sum(parts.values()) - parts["allocator_and_comm_overhead"]) / GIB


def tuned_estimate(ref: dict, row: dict, eff: Efficiency = DEFAULT) -> dict:
    """A row whose source chose activation checkpointing and the local batch for speed and published the fastest it
    found (`tuned = true`): the fastest plan that fits over `--estimate.search`'s AC modes and local batches, the
    rest of the row as written -- the answer a user who tunes the same two knobs gets from the estimator."""
    best = None
    for (mode, option), batch in itertools.product(AC_MODES, LOCAL_BATCHES):
        knobs = [f"--activation_checkpoint.mode={mode}", f"--activation_checkpoint.selective_ac_option={option}",
                 f"--training.local_batch_size={batch}"]  # fmt: skip
        try:
            r = estimate_plan(build_plan(training_cfg(ref, dict(row, args=[*row["args"], *knobs])), eff=eff))
        except UserError:
            continue  # a batch the layout cannot split
        if r["fits"] and (best is None or r["tokens_per_sec_per_device"] > best["tokens_per_sec_per_device"]):
            best = r
    if best is None:
        raise ValueError(f"{row['id']}: no activation checkpointing mode and local batch of the search fits")
    return best


def inference_estimate(ref: dict, row: dict, eff: Efficiency = DEFAULT) -> dict:
    cfg = parse_args([*row["args"], *ref["inference_common"]["estimate_args"], *row["estimate_args"]])
    e = cfg.estimate
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    tp = cfg.parallelism.tensor_parallel_degree
    return estimate_inference(
        args, inference_hardware(e, tp), e.batch_size, e.prompt_len, e.gen_len, e.weight_dtype, tp, eff=eff
    )


def stored_calibration(cal: dict) -> Calibration:
    c = Calibration(**{k: v for k, v in cal.items() if k != "matmul_tflops"})
    c.matmul_tflops = {tuple(x[:3]): x[3] for x in cal["matmul_tflops"]}
    return c


def cpu_estimate(row: dict, eff: Efficiency = DEFAULT) -> dict:
    """The estimate for a CPU row from the calibration stored with it (measured on the same machine)."""
    cfg = parse_args(
        [*row["args"], "--estimate.hardware=cpu", f"--estimate.num_devices={row['num_devices']}"]
    )
    return estimate_plan(build_plan(cfg, stored_calibration(row["calibration"]), eff=eff))


# quantity compared -> (published key in the row, estimate key, goal on |error|)
TRAINING_QUANTITIES = {
    "tokens/s/device": ("tokens_per_sec", "tokens_per_sec_per_device", 0.15),
    "memory GiB": ("memory_gib", "memory_gib", 0.10),
    "TFLOPS/device": ("tflops_per_device", "tflops_per_device", 0.15),
    "GPU-hours": ("gpu_hours", "gpu_hours", 0.25),
}


def table(
    ref: dict | None = None,
    eff: Efficiency = DEFAULT,
    sources: set[str] | None = None,
    quantities: tuple[str, ...] | None = None,
) -> list[dict]:
    """Every row (of `sources`, default all; of `quantities`, default all): what is compared, published and
    estimated values, relative error."""
    ref = ref or load_reference()
    out = []

    def keep(row: dict) -> bool:
        return sources is None or row["source"] in sources

    def wanted(*what: str) -> bool:
        return quantities is None or any(w in quantities for w in what)

    for row in filter(keep, ref["training"] if wanted(*TRAINING_QUANTITIES) else []):
        r = training_estimate(ref, row, eff)
        similar = anchor_kind(r)
        for what, (pub, est, goal) in TRAINING_QUANTITIES.items():
            if pub in row:
                estimated = r[est]
                if what == "memory GiB" and "memory_pipeline_rank" in row:  # a pipeline rank's own log line
                    estimated = r["memory_by_pipeline_rank_gib"][row["memory_pipeline_rank"]]
                out.append(dict(id=row["id"], source=row["source"], what=what, published=row[pub],
                                estimated=estimated, goal=goal, **device_and_layout(r), **similar))  # fmt: skip
                if what == "memory GiB":  # what an anchor leaves unscaled (memory.scale_peak)
                    out[-1]["state_gib"] = state_gib(r)
        if "memory_allocated_gib" in row:  # the source's counter: torch's allocated peak
            if "memory_gib" in row or row.get("tuned"):  # allocated_peak_gib plans the row as written
                raise ValueError(
                    f"{row['id']}: memory_allocated_gib needs a row without memory_gib and not tuned"
                )
            out.append(dict(id=row["id"], source=row["source"], what="memory GiB", published=row["memory_allocated_gib"],
                            estimated=allocated_peak_gib(ref, row, r, eff), goal=TRAINING_QUANTITIES["memory GiB"][2],
                            state_gib=state_gib(r), **device_and_layout(r), **similar))  # fmt: skip
    for row in filter(keep, ref["inference"] if wanted(DECODE_QUANTITY) else []):
        r = inference_estimate(ref, row, eff)
        out.append(dict(id=row["id"], source=row["source"], what=DECODE_QUANTITY, published=row["tokens_per_sec"],
                        estimated=r["tokens_per_sec"], goal=0.15, **device_and_layout(r)))  # fmt: skip
    for row in filter(keep, ref["cpu"] if wanted(*CPU_QUANTITIES) else []):
        r = cpu_estimate(row, eff)
        out.append(dict(id=row["id"], source=row["source"], what=STEP_TIME, published=row["step_time_s"],
                        estimated=r["step_time_s"], goal=0.15, **device_and_layout(r)))  # fmt: skip
        if "max_rss_gib" in row:  # a pipeline row's memory is its larger stage's, which rank 0 may not be
            out.append(dict(id=row["id"], source=row["source"], what=MAX_RSS, published=row["max_rss_gib"],
                            estimated=r["memory_gib"], goal=0.10, **device_and_layout(r)))  # fmt: skip
    out = [x for x in out if quantities is None or x["what"] in quantities]
    for x in out:
        x["error"] = x["estimated"] / x["published"] - 1
    return out


def anchor_kind(estimate: dict) -> dict:
    """Of a training estimate, what `anchored` pairs rows by beside the layout kind: its model (parameters), whether
    its blocks are compiled, and (memory pairs only) its activation checkpointing."""
    return {"model_params": estimate["model"]["params"], "compiled": "model" in estimate["layout"]["compile"],
            "ac_mode": estimate["layout"]["ac_mode"]}  # fmt: skip


def anchored(rows: list[dict], similar: bool = True, memory: bool = False) -> list[dict]:
    """Every ordered pair of tokens/s (or TFLOPS) rows of one source and device (`similar`: and of the same model,
    compile mode and layout kind): the first row's error once its estimate is scaled by the second's published /
    estimated, as `--estimate.anchor` scales a plan by a measured run (anchor.py). Labelled tokens/s/device (TFLOPS
    scale alike); `anchor` names the second row. `memory`: the memory GiB rows instead, paired as the anchor scales
    a peak (memory.scale_peak) -- of the same model, compile mode, layout kind other than pipeline parallel (a run's
    logged peak is rank 0's, the estimate's its worst stage's) and activation checkpointing."""
    wanted = ("memory GiB",) if memory else ("tokens/s/device", "TFLOPS/device")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        pipeline = r.get("layout") == "pipeline parallel"
        if r["what"] not in wanted or "model_params" not in r or (memory and pipeline):
            continue
        key = (r["source"], r["device"], r["what"])
        key += (r["layout"], r["model_params"], r["compiled"]) if similar or memory else ()
        key += (r["ac_mode"],) if memory else ()
        groups.setdefault(key, []).append(r)

    def scaled(r: dict, a: dict) -> float:
        if memory:
            ratio = rest_ratio(a["published"], a["estimated"], a["state_gib"])
            return scale_peak(r["estimated"], r["state_gib"], ratio)
        return r["estimated"] * a["published"] / a["estimated"]

    return [
        {**r, "what": wanted[0], "anchor": a["id"], "error": scaled(r, a) / r["published"] - 1}
        for group in groups.values()
        for r in group
        for a in group
        if a is not r
    ]


def layout_kind(layout: dict, num_devices: int) -> str:
    """The kind of layout a training row or estimate has, the first that applies: one device, pipeline parallel,
    context parallel, tensor parallel, data parallel (FSDP / HSDP)."""
    if num_devices == 1:
        return "one device"
    for dim, kind in (("pp", "pipeline parallel"), ("cp", "context parallel"), ("tp", "tensor parallel")):
        if layout.get(dim, 1) > 1:
            return kind
    return "data parallel"


def device_and_layout(estimate: dict) -> dict:
    """The device (hardware-table name) and layout kind of a training or inference estimate: what a table row is
    compared by (accuracy.py). An inference estimate's layout is one device or tensor parallel."""
    if estimate["mode"] == "inference":
        return {
            "device": estimate["hardware"],
            "layout": "tensor parallel" if estimate["tp"] > 1 else "one device",
        }
    hw = estimate["hardware"]
    return {"device": hw["name"], "layout": layout_kind(estimate["layout"], hw["num_devices"])}


def sources(ref: dict) -> list[str]:
    rows = ref["training"] + ref["inference"] + ref["cpu"]
    return sorted({r["source"] for r in rows})


def median_abs_error(rows: list[dict]) -> float:
    return statistics.median(abs(x["error"]) for x in rows) if rows else 0.0


def quantities_of(ref: dict, source: str) -> set[str]:
    """The compared quantities a source has rows of (read from the reference file, without estimating)."""
    out = set()
    for row in ref["training"]:
        if row["source"] == source:
            out |= {what for what, (pub, _, _) in TRAINING_QUANTITIES.items() if pub in row}
    if any(r["source"] == source for r in ref["inference"]):
        out.add(DECODE_QUANTITY)
    for row in ref["cpu"]:
        if row["source"] == source:
            out |= {STEP_TIME} | ({MAX_RSS} if "max_rss_gib" in row else set())
    return out


def fit(
    ref: dict, exclude: str | None, fitted: dict[str, Fit] | None = None, cache: dict | None = None
) -> Efficiency:
    """The Efficiency whose `fitted` constants minimise the median absolute error over the rows of their quantities
    whose source is not `exclude` (a grid search, one constant at a time in the listed order; the smallest value
    among equals); DEFAULT when nothing is fitted. `cache` keeps each source's rows per tried Efficiency, so that
    the fits of one cross-validation estimate every (source, value) once."""
    fitted = FITTED if fitted is None else fitted
    cache = {} if cache is None else cache
    eff = DEFAULT
    train = [s for s in sources(ref) if s != exclude]
    for name, f in fitted.items():
        scored = []
        for v in f.grid:
            tried = dataclasses.replace(eff, **{name: v})
            rows = []
            for s in train:
                if (tried, s, f.quantities) not in cache:
                    cache[tried, s, f.quantities] = table(ref, tried, {s}, f.quantities)
                rows += cache[tried, s, f.quantities]
            scored.append((median_abs_error(rows), v))
        eff = dataclasses.replace(eff, **{name: min(scored)[1]})
    return eff


def cross_validated(
    ref: dict | None = None, fitted: dict[str, Fit] | None = None, quantities: tuple[str, ...] | None = None
) -> list[dict]:
    """Each source's rows (of `quantities`, default all) estimated with the constants fitted without that source
    (leave one source out). A source with no rows of a fitted quantity leaves the fit unchanged: it shares the fit
    on every source. When no quantity asked for is fitted, nothing is fitted (the rows equal the in-sample ones)."""
    ref = ref or load_reference()
    fitted = FITTED if fitted is None else fitted
    moved = set().union(*(f.quantities for f in fitted.values()))
    asked = moved if quantities is None else moved & set(quantities)
    fits: dict[str | None, Efficiency] = {}
    cache: dict = {}
    out = []
    for s in sources(ref):
        held_out = s if quantities_of(ref, s) & asked else None
        if held_out not in fits:
            fits[held_out] = fit(ref, held_out, fitted, cache) if asked else DEFAULT
        eff = fits[held_out]
        rows = table(ref, eff, {s}, quantities)
        for x in rows:
            x["fitted"] = {k: getattr(eff, k) for k in fitted}
        out += rows
    return out
