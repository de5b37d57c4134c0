"""A torchtitan training log read as an anchor (`--estimate.anchor=LOG`, anchor.py).

torchtitan (github.com/pytorch/torchtitan) writes no metrics file a run folder keeps by default; what its users
have is the console log of rank 0 (torchrun's output, a SLURM job's .out file). The lines read here, as its logger
wrote them from its public release (2024-04) to 2026 (read from its history; colour codes and torchrun's
"[rankN]:" / srun's "N: " prefixes are stripped, and only rank 0's lines are read when several ranks are in one file;
several ranks logging without a prefix give one step each, its first tokens/s and its largest memory):

- the step line: "step: 10  loss: 9.1  [grad_norm: 1.2  ]memory: 45.67GiB(48.07%)  wps|tps: 6,789  ..."; "wps"
  until 2024-11, "tps" since; both are tokens per second per device (the rank's tokens over the time and the
  model-parallel degree). Its memory is the largest reserved memory since the previous step line (per device).
- the mesh: "Building N-D device mesh with ['dp_shard', 'tp'], [4, 2]" (degrees above 1 only; 'dp' until 2024-08
  is the FSDP degree), since 2025-12 "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8,
  cp=1, tp=1, ep=1". The world size is the degrees' product.
- the device: "GPU capacity: NVIDIA H100 80GB HBM3 (0) with 79.11GiB memory" (2024), "CUDA capacity: ..." since.
- the batch: "... local batch size 2, global batch size 16, [gradient accumulation steps 1, ]sequence length 8192,"
  (2024-07 .. 2026-08), since 2026-08 (torchtitan#4121) "Trainer is initialized with 16384 tokens per DP rank,
  131072 tokens per train step, gradient accumulation steps 1, maximum context length 2048, ...": a data-parallel
  rank's tokens of one micro-step (its pipeline micro-batches included) packed into rows of documents of at most
  the context length, read as local batch = tokens per DP rank / context length rows of that length (exact for
  the linear layers; attention, masked per document, does at most the causal work of such rows, less where
  documents are shorter) and global batch = tokens per train step / context length.
- the model: "Model llama3 8B size: 8,030,261,248 total parameters".
- what was applied: "Compiled|Compiling each TransformerBlock with torch.compile", "Compiling the loss function
  with torch.compile", "Applied full|selective activation checkpointing to the model", since 2026-06
  "Applied FullAC|SelectiveAC activation checkpointing ..." (none: no line; memory_budget / MemoryBudgetAC, the
  compiler's budgeted recomputation of 2025-10 on, is not priced and refused), float8:
  "Swapped to Float8Linear float8 linear layers" / "Swapped to Float8Linear layers" (2024-04 .. 07), "Float8
  training active" (2024-07 .. 2025-02, tensorwise), "Float8 tensorwise scaled training active", "Float8 training
  active with recipe rowwise" (since 2025-02; a recipe priced here: tensorwise, rowwise); MX and NVFP4 linear
  layers ("MX training active ...", "Swapped to MXLinear layers", "Converted Linear layers to MXFP8Linear" /
  "NVFP4Linear") are not priced and refused.

- the era of its recompute: torchtitan's PR #1580 (2025-08-29) made `activation_checkpoint.early_stop` default to
  false (since 2026-06 it is not an option: always false), so a fully checkpointed eager block recomputes its whole
  forward, w2 included, where torch's default (the trainer's, and torchtitan's before) stops before w2. A log is
  dated after that PR by any of: the GC line's "[GC] Initial GC collection took 0.00 seconds" (torchtitan#1737,
  2025-09-22; "... collection 0.00 seconds" before), the keyword mesh line (2025-12), the AC class names (2026-06),
  the tokens-per-DP-rank line (2026-08); its run is then estimated with `--estimate.ac_early_stop=false`. A log of
  2025-08-29 .. 09-22 shows none of them and keeps the plan's setting (a user who set early_stop back to true in
  2025-09 .. 2026-06 is not seen either).

What the log states about the layout, batch, compile, activation checkpointing, float8 and the recompute's era
overrides the config the run is estimated with (torchtitan runs are often launched with command-line overrides the
TOML does not hold).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from torchtitan.errors import UserError

_ANSI = re.compile(r"\x1b?\[[0-9;]*m")  # colour codes, also as pasted without their ESC
_RANK = re.compile(r"^\s*(?:\[rank(\d+)\]:|(\d+): )")
_STEP = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:.*?memory:\s*([\d.]+)GiB.*?\b[wt]ps:\s*([\d,]+)")
_MESH_ND = re.compile(r"Building \d+-D device mesh with \[(.*?)\], \[(.*?)\]")
_MESH_KW = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+(?:, )?)+)")
_DEVICE = re.compile(r"\b[A-Z]+ capacity: (.+?)(?: \(\d+\))? with [\d.]+GiB memory")
_BATCH = re.compile(
    r"local batch size:? (\d+), (?:global batch size (\d+), )?(?:gradient accumulation steps \d+, )?"
    r"sequence length:? (\d+)"
)
_TOKEN_BATCH = re.compile(
    r"(\d+) tokens per DP rank, (\d+) tokens per train step, .*?maximum context length (\d+)"
)
_PARAMS = re.compile(r"Model \S+ \S+ size: ([\d,]+) total parameters")
_COMPILED = re.compile(r"Compil(?:ed|ing) each TransformerBlock with torch\.compile")
_COMPILED_LOSS = re.compile(r"Compiling the loss function with torch\.compile")
_AC = re.compile(r"Applied (\w+) activation checkpointing to the model")
_FLOAT8 = re.compile(r"Swapped to .*[Ff]loat8.* layers|Float8 .*training active")
_RECIPE = re.compile(r"Float8 training active with recipe (\w+)")
# lines that date a log after torchtitan#1580 (2025-08-29), whose checkpointed blocks recompute w2 too (the module
# docstring): the GC line's "took" (torchtitan#1737, 2025-09-22), the keyword mesh line, the tokens per DP rank, the
# AC class names
_AFTER_WHOLE_RECOMPUTE = (
    re.compile(r"\[GC\] .+ took [\d.]+ seconds"),
    _MESH_KW,
    _TOKEN_BATCH,
    re.compile(r"Applied (?:FullAC|SelectiveAC) activation checkpointing"),
)
# MX / NVFP4 linear layers (2025-03 on): "MX training active with recipe mxfp8", "Swapped to MXLinear layers",
# "Converted Linear layers to MXFP8Linear" / "NVFP4Linear"
_OTHER_LOW_PRECISION = re.compile(
    r"MX training active with recipe (\w+)|Swapped to (MX)Linear layers|Converted Linear layers to (\w+)Linear"
)

# torchtitan's activation checkpointing, as its log names it -> our mode
_AC_MODES = {"full": "full", "selective": "selective", "FullAC": "full", "SelectiveAC": "selective"}

# torchtitan's mesh dimension -> our degree
_DEGREES = {
    "pp": "pipeline_parallel_degree",
    "dp_replicate": "data_parallel_replicate_degree",
    "dp_shard": "data_parallel_shard_degree",
    "dp": "data_parallel_shard_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
}


@dataclass
class TorchtitanLog:
    steps: list[tuple[int, float, float]]  # (step, tokens/s per device, max reserved GiB) of each step logged
    degrees: dict[str, int]  # torchtitan's mesh dimension -> degree (all of ours: 1 where not in the mesh)
    device: str | None  # the torch device name, as logged
    params: int | None
    settings: dict[str, object] = field(default_factory=dict)  # our "section.key" -> what the log states

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())


def _rank0_lines(text: str) -> list[str]:
    out = []
    for line in _ANSI.sub("", text).splitlines():
        m = _RANK.match(line)
        if m is None or (m.group(1) or m.group(2)) == "0":
            out.append(line[m.end() :] if m else line)
    return out


def _steps(lines: list[str]) -> list[tuple[int, float, float]]:
    """One entry per step: its first line's tokens/s, the largest memory of its lines (several ranks may log
    without a prefix)."""
    by_step: dict[int, tuple[float, float]] = {}
    for line in lines:
        if m := _STEP.search(line):
            step, memory, tps = int(m.group(1)), float(m.group(2)), float(m.group(3).replace(",", ""))
            first, peak = by_step.get(step, (tps, 0.0))
            by_step[step] = (first, max(peak, memory))
    return [(step, tps, memory) for step, (tps, memory) in by_step.items()]


def step_rows(text: str) -> list[tuple[int, float, float]]:
    """(step, tokens/s per device, max reserved GiB) of each step a torchtitan log's rank 0 wrote (also
    scripts/bench_torchtitan.py's reading of the torchtitan side)."""
    return _steps(_rank0_lines(text))


def _degrees(lines: list[str], path: str) -> dict[str, int]:
    for line in lines:
        if m := _MESH_KW.search(line):
            got = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split(", "))}
            break
        if m := _MESH_ND.search(line):
            names = [n.strip().strip("'\"") for n in m.group(1).split(",") if n.strip()]
            sizes = [int(n) for n in m.group(2).split(",") if n.strip()]
            got = dict(zip(names, sizes, strict=True))
            break
    else:
        raise UserError(
            f"estimate.anchor {path}: no 'Building ... device mesh' line, so not the world size either: give the log"
            " of rank 0 from the run's start (torchtitan writes the mesh before the model)"
        )
    if got.pop("ep", 1) != 1 or set(got) - set(_DEGREES):
        raise UserError(
            f"estimate.anchor {path}: the run's mesh {got} has dimensions a Llama 3 plan does not have"
        )
    degrees = {name: 1 for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
    for name, size in got.items():
        degrees["dp_shard" if name == "dp" else name] = size
    return degrees


def read_log(path: str) -> TorchtitanLog:
    """The figures and settings a torchtitan log of rank 0 states (one line naming what is missing otherwise)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise UserError(f"estimate.anchor {path}: cannot read it: {e.strerror}") from None
    lines = _rank0_lines(text)
    steps = _steps(lines)
    if not steps:
        raise UserError(
            f"estimate.anchor {path}: no torchtitan step line ('step: N  loss: ...  memory: ...GiB(...)  tps: ...')"
            " and not a run folder of this trainer: give a torchtitan log of rank 0 or a run's job.dump_folder"
        )
    log = TorchtitanLog(steps, _degrees(lines, path), None, None)
    settings = log.settings
    for name, size in log.degrees.items():
        settings[f"parallelism.{_DEGREES[name]}"] = size
    compiled = loss = float8 = False
    recipe = "tensorwise"
    ac = "none"
    whole_recompute = False
    for line in lines:
        if (m := _DEVICE.search(line)) and log.device is None:
            log.device = m.group(1).strip()
        elif (m := _PARAMS.search(line)) and log.params is None:
            log.params = int(m.group(1).replace(",", ""))
        elif m := _BATCH.search(line):
            local, global_, seq = m.groups()  # global: the sequences of all micro-steps of a step
            settings["training.local_batch_size"], settings["training.seq_len"] = int(local), int(seq)
            settings["training.global_batch_size"] = int(global_) if global_ else -1
        elif m := _TOKEN_BATCH.search(line):
            per_rank, per_step, context = (int(g) for g in m.groups())
            if per_rank % context:
                raise UserError(
                    f"estimate.anchor {path}: the run's {per_rank} tokens per DP rank are not whole rows of its"
                    f" maximum context length {context}; anchor on a run whose tokens per micro-batch are a"
                    " multiple of it"
                )
            settings["training.local_batch_size"], settings["training.seq_len"] = per_rank // context, context
            settings["training.global_batch_size"] = per_step // context
        elif m := _AC.search(line):
            if m.group(1) not in _AC_MODES:
                raise UserError(
                    f"estimate.anchor {path}: the run used {m.group(1)} activation checkpointing; the estimator"
                    " prices full and selective (and none): anchor on a run of one of those"
                )
            ac = _AC_MODES[m.group(1)]
        elif m := _RECIPE.search(line):
            recipe = m.group(1)
        elif m := _OTHER_LOW_PRECISION.search(line):
            raise UserError(
                f"estimate.anchor {path}: the run trained with {next(g for g in m.groups() if g)} linear layers; the"
                " estimator prices bf16 and float8 tensorwise and rowwise: anchor on a run of one of those"
            )
        whole_recompute |= any(p.search(line) for p in _AFTER_WHOLE_RECOMPUTE)
        compiled |= bool(_COMPILED.search(line))
        loss |= bool(_COMPILED_LOSS.search(line))
        float8 |= bool(_FLOAT8.search(line))
    settings["compile.enable"] = compiled or loss
    if compiled or loss:
        settings["compile.components"] = [c for c, on in (("model", compiled), ("loss", loss)) if on]
    settings["activation_checkpoint.mode"] = ac
    if whole_recompute:
        settings["estimate.ac_early_stop"] = False
    settings["float8.enable"] = float8
    if float8:
        if recipe not in ("tensorwise", "rowwise"):
            raise UserError(
                f"estimate.anchor {path}: the run trained with the float8 recipe {recipe!r}; the estimator prices"
                " tensorwise and rowwise: anchor on a run of one of those"
            )
        settings["float8.recipe"] = recipe
    return log
