"""torchtitan's TOML config names (and its registry's Llama 3 entries) and what each one is here: the table behind
the parser and the converter.

torchtitan (github.com/pytorch/torchtitan) configured runs with TOML files until PR #2386 (Feb 2026) replaced
them with Python config registries; v0.2.2 is its last release with TOML. Its llama3 files come in three eras
(torchtitan_compat.py describes them and converts such a file). `torchtitan_file_keys` and `hint` let the strict
parser (manager.py) recognise a torchtitan file and answer a torchtitan name with its equivalent, never with a
look-alike of another meaning. The table is its own module because both the parser and the converter read it,
and the converter checks its result with the parser: one module for both would import them in a circle.
The facts behind the table (keys, defaults, formulas of each era) were read from torchtitan's history;
docs/configuration.md "Coming from torchtitan" lists them.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ERAS = ("2024", "2025", "2026")
CONVERTER = "python scripts/convert_torchtitan_config.py"

_ANY = object()


@dataclass(frozen=True)
class Rule:
    """What torchtitan's `section.key` is here.

    kind: "rename" (value goes to `target`, through `fn` if given), "drop" (already our behaviour when the value
    is one of `ok`, else not expressible), "custom" (handled in convert()), "unsupported" (a value other than
    `ok` cannot be expressed; `note` names the nearest equivalent).
    """

    kind: str
    target: str | None = None
    note: str = ""
    ok: Any = _ANY
    fn: Any = None


def _rn(target, note="", fn=None):
    return Rule("rename", target, note, fn=fn)


def _drop(note, ok=_ANY):
    return Rule("drop", None, note, ok)


def _unsup(note, ok):
    return Rule("unsupported", None, note, ok)


def _custom(target=None, note=""):
    return Rule("custom", target, note)


_PRERELEASE = "a key of torchtitan's first months (Feb - Apr 2024, before its public release); "
_PRERELEASE_KEYS = {
    "profiling.run_profiler": "nearest: profiling.enable_profiling",
    "profiling.profile_every_x_iter": "nearest: profiling.profile_freq",
    "training.warmup_pct": "nearest: lr_scheduler.warmup_steps (a step count)",
    "training.sequence_parallel_degree": "nearest: parallelism.tensor_parallel_degree (with sequence parallel)",
    "training.checkpoint_interval": "nearest: checkpoint.interval (in steps)",
    "training.checkpoint_interval_type": "nearest: checkpoint.interval (in steps)",
    "training.checkpoint_folder": "nearest: checkpoint.enable and checkpoint.folder",
    "training.enable_selective_ac": "nearest: activation_checkpoint.mode",
}
_DATA_FILES = "ours reads .json/.jsonl/.parquet/.txt files (a file, a glob or a folder of them)"
_FLOAT8 = {
    "enable_float8_linear": _rn("float8.enable"),
    "enable_fsdp_float8_all_gather": _rn("float8.enable_fsdp_float8_all_gather"),
    "precompute_float8_dynamic_scale_for_fsdp": _rn("float8.precompute_float8_dynamic_scale_for_fsdp"),
    "recipe_name": _custom("float8.recipe"),
    "filter_fqns": _custom("float8.min_dim"),
    "emulate": _rn("float8.emulate"),
    "force_recompute_fp8_weight_in_bwd": _unsup("no such option here", (False,)),
    "scaling_type_input": _unsup(
        "ours scales dynamically (torchao's delayed scaling was removed)", ("dynamic",)
    ),
    "scaling_type_weight": _unsup("ours scales dynamically", ("dynamic",)),
    "scaling_type_grad_output": _unsup("ours scales dynamically", ("dynamic",)),
    "moe_fqns_prototype": _unsup("no MoE models here", ([],)),
}

# torchtitan's "section.key" -> Rule. A key absent from this table whose name is also ours means the same here.
KEYS: dict[str, Rule] = {
    "job.print_args": _rn("job.print_config"),
    "job.use_for_integration_test": _drop("a marker for torchtitan's own CI; it changes nothing in a run"),
    "metrics.use_for_integration_test": _drop(
        "a marker for torchtitan's own CI; it changes nothing in a run"
    ),
    "job.save_config_file": _unsup(
        "ours writes the effective config to <dump_folder>/config.toml", (None, "")
    ),
    "job.custom_config_module": _unsup("no Python is executed from configs here", ("",)),
    "profiling.enable_memory_snapshot": _custom("profiling.memory_snapshot_steps"),
    "profiling.save_memory_snapshot_folder": _rn("profiling.memory_snapshot_folder"),
    "profiling.profiler_active": _custom(note="ours records one step per profile_freq window"),
    "profiling.profiler_warmup": _custom(note="ours warms the profiler up by itself"),
    "metrics.disable_color_printing": _drop("our log lines carry no colour codes"),
    "metrics.enable_color_printing": _drop("our log lines carry no colour codes"),
    "metrics.save_tb_folder": _drop("TensorBoard files always go to <dump_folder>/tb here", ("tb",)),
    "metrics.rank_0_only": _drop("rank 0 writes TensorBoard here", (True,)),
    "metrics.save_for_all_ranks": _unsup(
        "nearest: metrics.wandb_every_rank (one W&B run per rank)", (False,)
    ),
    "model.norm_type": _custom(),
    "model.name": _custom("model.name"),
    "model.flavor": _custom("model.flavor"),
    "model.hf_assets_path": _custom("model.tokenizer_path"),
    "model.converters": _custom("float8.enable"),
    "model.print_after_conversion": _unsup("no such printout here", (False,)),
    "optimizer.fused": _custom("optimizer.implementation"),
    "optimizer.early_step_in_backward": _unsup("no optimizer-in-backward here", (False,)),
    "lr_scheduler.lr_min": _rn("lr_scheduler.min_lr_factor", "a fraction of optimizer.lr in both"),
    "lr_scheduler.total_steps": _unsup("the schedule spans training.steps here", (None,)),
    "training.batch_size": _rn("training.local_batch_size"),
    "training.warmup_steps": _rn("lr_scheduler.warmup_steps"),
    "training.data_parallel_degree": _rn(
        "parallelism.data_parallel_shard_degree",
        "torchtitan's one data-parallel degree of 2024, FSDP over the ranks the other degrees leave, before its"
        " replicate / shard split",
    ),
    "training.pipeline_parallel_degree": _rn("parallelism.pipeline_parallel_degree"),
    "training.fsdp_reshard_after_forward": _rn("parallelism.fsdp_reshard_after_forward"),
    "training.fp8_linear": _custom("float8.enable"),
    "training.enable_fp8_linear": _rn("float8.enable"),
    "training.enable_float8_linear": _rn("float8.enable"),
    "training.data_parallel_replicate_degree": _rn("parallelism.data_parallel_replicate_degree"),
    "training.data_parallel_shard_degree": _rn("parallelism.data_parallel_shard_degree"),
    "training.tensor_parallel_degree": _rn("parallelism.tensor_parallel_degree"),
    "training.enable_cpu_offload": _rn("parallelism.fsdp_cpu_offload"),
    "training.disable_loss_parallel": _rn("parallelism.enable_loss_parallel", "negated", fn=lambda v: not v),
    "training.compile": _rn("compile.enable"),
    "training.dataset": _custom("data.dataset"),
    "training.dataset_path": _rn("data.dataset_path", _DATA_FILES),
    "training.gc_debug": _unsup("no GC debug mode here", (False,)),
    "training.dtype": _unsup("parameters are float32 here (bf16 compute by mixed precision)", ("float32",)),
    "training.dataloader": _drop("the data loader runs in the training process here (no worker options)"),
    "experimental.context_parallel_degree": _rn("parallelism.context_parallel_degree"),
    "experimental.context_parallel_rotate_method": _rn("parallelism.context_parallel_rotate_method"),
    "experimental.pipeline_parallel_degree": _rn("parallelism.pipeline_parallel_degree"),
    "experimental.pipeline_parallel_split_points": _rn("parallelism.pipeline_parallel_split_points"),
    "experimental.pipeline_parallel_schedule": _custom("parallelism.pipeline_parallel_schedule"),
    "experimental.pipeline_parallel_schedule_csv": _unsup(
        "nearest: parallelism.pipeline_parallel_schedule", ("",)
    ),
    "experimental.pipeline_parallel_microbatches": _custom("parallelism.pipeline_parallel_microbatch_size"),
    "experimental.enable_async_tensor_parallel": _custom(),
    "experimental.enable_compiled_autograd": _unsup("no compiled autograd here", (False,)),
    "experimental.custom_import": _unsup("no Python is executed from configs here", ("",)),
    "experimental.custom_args_module": _unsup("no Python is executed from configs here", ("",)),
    "parallelism.enable_async_tensor_parallel": _custom(),
    "parallelism.disable_loss_parallel": _rn(
        "parallelism.enable_loss_parallel", "negated", fn=lambda v: not v
    ),
    "parallelism.enable_compiled_autograd": _unsup("no compiled autograd here", (False,)),
    "parallelism.pipeline_parallel_schedule": _custom("parallelism.pipeline_parallel_schedule"),
    "parallelism.pipeline_parallel_schedule_csv": _unsup(
        "nearest: parallelism.pipeline_parallel_schedule", ("",)
    ),
    "parallelism.pipeline_parallel_layers_per_stage": _unsup(
        "nearest: parallelism.pipeline_parallel_split_points", (None,)
    ),
    "parallelism.pipeline_parallel_first_stage_less_layers": _unsup(
        "nearest: parallelism.pipeline_parallel_split_points", (1,)
    ),
    "parallelism.pipeline_parallel_last_stage_less_layers": _unsup(
        "nearest: parallelism.pipeline_parallel_split_points", (1,)
    ),
    "parallelism.module_fqns_per_model_part": _unsup(
        "nearest: parallelism.pipeline_parallel_split_points", (None,)
    ),
    "parallelism.pipeline_parallel_expert_parallel_overlap": _drop("no MoE models here"),
    "parallelism.context_parallel_load_balancer": _unsup(
        "ours balances the causal load head-tail (rank r keeps chunks r and 2cp-1-r), torchtitan's default",
        ("headtail",),
    ),
    "parallelism.expert_parallel_degree": _unsup("no MoE models here", (1,)),
    "parallelism.expert_tensor_parallel_degree": _unsup("no MoE models here", (1,)),
    "parallelism.expert_parallel_comm_backend": _unsup("no MoE models here", ("standard",)),
    "checkpoint.enable_checkpoint": _rn("checkpoint.enable"),
    "checkpoint.interval_type": _drop("checkpoint.interval counts steps here", ("steps",)),
    "checkpoint.model_weights_only": _rn("checkpoint.last_save_model_only"),
    "checkpoint.last_save_model_weights_only": _rn("checkpoint.last_save_model_only"),
    "checkpoint.async_mode": _custom("checkpoint.async_mode"),
    "checkpoint.exclude_from_loading": _unsup("a resume loads everything here", ([],)),
    "checkpoint.enable_first_step_checkpoint": _unsup("nearest: checkpoint.create_seed_checkpoint", (False,)),
    "checkpoint.last_save_in_hf": _unsup(
        "nearest: python scripts/convert_dcp_to_hf.py after training", (False,)
    ),
    "checkpoint.initial_load_in_hf": _unsup(
        "nearest: python scripts/convert_hf_to_dcp.py, then checkpoint.initial_load_path", (False,)
    ),
    "checkpoint.initial_load_in_hf_quantized": _unsup("no quantized HF loading here", (False,)),
    "checkpoint.enable_ft_dataloader_checkpoints": _drop(
        "no torchft here; the data loader state is always saved"
    ),
    "checkpoint.load_only": _unsup(
        "nearest: scripts/generate.py or scripts/perplexity.py --checkpoint", (False,)
    ),
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": _drop(
        "its default names MoE router gates, which a Llama 3 block has none of; ours' selective 'op' policy"
        " recomputes every second matmul of a block, as torchtitan's does"
    ),
    "activation_checkpoint.early_stop": _unsup("no such option here", (False,)),
    "activation_checkpoint.memory_budget": _drop("used only by torchtitan's memory_budget mode"),
    "activation_checkpoint.visualize_memory_budget_pareto": _unsup("no such option here", (False,)),
    "activation_checkpoint.preserve_rng_state": _drop(
        "the model has no dropout: recomputing draws no random numbers"
    ),
    "activation_checkpoint.determinism_check": _drop("torch's default check applies here", ("default",)),
    "activation_checkpoint.debug": _unsup("no such option here", (False,)),
    "compile.backend": _unsup("ours compiles with inductor", ("inductor",)),
    "validation.enabled": _rn("validation.enable"),
    "validation.dataset": _custom("validation.dataset"),
    "validation.dataset_path": _rn("validation.dataset_path", _DATA_FILES),
    "validation.local_batch_size": _custom("training.local_batch_size"),
    "validation.seq_len": _custom("training.seq_len"),
    "validation.steps": _custom("validation.steps"),
    "validation.dataloader": _drop("the data loader runs in the training process here (no worker options)"),
    "comm.trace_buf_size": _drop(
        "ours sets NCCL's flight recorder itself (2,000 collectives per process group, torchtitan/runtime_env.py)"
    ),
    "comm.save_traces_folder": _drop("ours dumps NCCL's flight recorder into <dump_folder>/logs on a hang"),
    "comm.save_traces_file_prefix": _drop(
        "ours dumps NCCL's flight recorder into <dump_folder>/logs on a hang"
    ),
    "memory_estimation.enabled": _custom(),
    "memory_estimation.enable": _custom(),
    "memory_estimation.disable_fake_mode": _drop("the estimator is analytic here (no fake tensors)"),
    "fault_tolerance.enable": _unsup("no torchft here; nearest: checkpoints and a restart", (False,)),
    **{
        f"fault_tolerance.{k}": _drop("no torchft here; used only with fault_tolerance.enable")
        for k in (
            "process_group",
            "process_group_timeout_ms",
            "replica_id",
            "group_size",
            "min_replica_size",
            "semi_sync_method",
            "sync_steps",
            "should_quantize",
            "fragment_sync_delay",
            "fragment_update_alpha",
        )
    },
    "comm.mode": _custom("comm.mode"),
    "debug.seed": _rn("training.seed"),
    "debug.deterministic": _rn("training.deterministic"),
    "debug.deterministic_warn_only": _unsup("deterministic mode raises here", (False,)),
    "debug.moe_force_load_balance": _drop("no MoE models here"),
    **{f"float8.{k}": r for k, r in _FLOAT8.items()},
    # [quantize.linear.float8] was [quantize.dense.float8] for a few weeks (Sep 2025)
    **{
        f"quantize.{part}.float8.{k}": r
        for part in ("linear", "dense")
        for k, r in _FLOAT8.items()
        if k != "enable_float8_linear"
    },
    **{
        k: _drop(
            "a setting of torchtitan's MX or grouped-GEMM (MoE) converters, used only when model.converters names them"
        )
        for k in (
            "quantize.linear.mx.filter_fqns",
            "quantize.grouped_mm.float8.fqns",
            "quantize.grouped_mm.mx.fqns",
        )
    },
    # torchtitan's first months (Feb - Apr 2024, partly as "torchtrain", before its public release)
    **{k: _unsup(_PRERELEASE + note, ()) for k, note in _PRERELEASE_KEYS.items()},
}
# Names a parser user may type from torchtitan's docs: the table's renames answer them directly.
_PROSE = {
    "model.converters": 'model.converters = ["float8"] is float8.enable = true here',
    "quantize": "torchtitan's [quantize.linear.float8] is [float8] here",
    "experimental": "torchtitan's [experimental] degrees are in [parallelism] here",
    "float8.enable_float8_linear": "torchtitan's float8.enable_float8_linear is float8.enable here",
}


def flatten(toml: dict) -> dict[str, Any]:
    """{'quantize': {'linear': {'float8': {'emulate': True}}}} -> {'quantize.linear.float8.emulate': True}.

    Tables that are values of a known key (training.dataloader) stay whole."""
    out: dict[str, Any] = {}

    def walk(prefix: str, table: dict):
        for k, v in table.items():
            name = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and name not in KEYS:
                walk(name, v)
            else:
                out[name] = v

    walk("", toml)
    return out


@functools.cache  # the schema is fixed: read once (get_type_hints compiles every annotation each call: 0.4 ms)
def _our_keys() -> frozenset[str]:
    from .job_config import JobConfig

    hints = typing.get_type_hints(JobConfig)
    return frozenset(
        f"{f.name}.{g.name}" for f in dataclasses.fields(JobConfig) for g in dataclasses.fields(hints[f.name])
    )


def torchtitan_file_keys(toml: dict) -> list[str]:
    """The keys of a parsed TOML file that are torchtitan's and not ours, when there are two or more: then it is a
    torchtitan file (to be converted); else [] (a single such key in one of our files is answered key by key)."""
    ours = _our_keys()
    found = [k for k in flatten(toml) if k in KEYS and k not in ours]
    return found if len(found) >= 2 else []


def hint(name: str) -> str | None:
    """For a key (or section) the parser does not know: what it is here, when it is a torchtitan name."""
    if name in _PROSE:
        return _PROSE[name]
    rule = KEYS.get(name)
    if rule is None:
        return None
    if rule.kind == "rename":
        neg = " (negated)" if rule.fn is not None else ""
        return f"torchtitan's {name} is '{rule.target}' here{neg}"
    if rule.kind == "custom" and rule.target:
        return f"torchtitan's {name} maps to '{rule.target}' here ({CONVERTER} explains how)"
    return f"torchtitan's {name}: {rule.note or 'see ' + CONVERTER}"


def suggested_output(path: str) -> str:
    p = Path(path)
    return str(p.with_name(p.stem + "_converted.toml"))


# torchtitan's launch since PR #2386: `--module llama3 --config llama3_8b` names a function of its Python config
# registry (torchtitan/models/llama3/config_registry.py at b5bcd76, 2026-08), not a file. Its Llama 3 training
# entries and the file shipped here for the same model and layout (their settings are this trainer's defaults, not
# the registry's: the registry of 2026 has options the TOML files never had, e.g. its chunked loss and Grain loader).
REGISTRY_FLAGS = ("module", "config")
REGISTRY_COUNTERPARTS = {
    "llama3_debugmodel": "train_configs/debug_model.toml",
    "llama3_8b": "train_configs/llama3_8b.toml",
    "llama3_70b": "train_configs/llama3_70b.toml",
    "llama3_405b": "train_configs/llama3_405b.toml",
}


def registry_hint(flags: dict[str, str]) -> str | None:
    """One line for torchtitan's registry launch among the command line's flags (`--module X --config Y`), or None
    when neither flag is there."""
    given = {k: flags[k] for k in REGISTRY_FLAGS if k in flags}
    if not given:
        return None
    shown = " ".join(f"--{k} {v}" for k, v in given.items())
    counterpart = REGISTRY_COUNTERPARTS.get(given.get("config", ""))
    if counterpart:
        use = f"the file shipped here for that run is --job.config_file={counterpart}"
    else:
        use = "pass a TOML file: --job.config_file=<file>; shipped: " + ", ".join(
            REGISTRY_COUNTERPARTS.values()
        )
    return (
        f"'{shown}' is torchtitan's config registry (its launch since pytorch/torchtitan#2386, Feb 2026), which"
        f" this trainer does not read; {use} (docs/configuration.md, 'Coming from torchtitan')"
    )
