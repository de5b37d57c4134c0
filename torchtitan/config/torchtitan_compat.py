"""The converter of torchtitan TOML configs into ours.

torchtitan (github.com/pytorch/torchtitan) configured runs with TOML files until PR #2386 (Feb 2026) replaced
them with Python config registries; v0.2.2 is its last release with TOML. Its llama3 files come in three eras:

- "2024": [training] holds batch_size, warmup_steps and the dp/tp degrees, [experimental] the pp/cp degrees,
  checkpoint.enable_checkpoint / interval_type / model_weights_only, [float8] enable_float8_linear,
  model.norm_type; Meta's tiktoken tokenizer.model.
- "2025": [parallelism], [lr_scheduler] (lr_min), training.local_batch_size, model.converters,
  checkpoint.enable_checkpoint + last_save_model_only, validation.enabled, a Hugging Face tokenizer folder.
- "2026" (the last files, to Feb 2026): model.hf_assets_path, checkpoint.enable, [compile],
  [quantize.linear.float8], lr_scheduler.min_lr_factor, validation.enable, job.print_config.

Between and before them, keys of single months convert too (the table names them: one data-parallel degree and
float8 switches under [training] in 2024, FSDP resharding under [training] in early 2025, [quantize.dense.float8] in
Sep 2025, ...), and torchtitan's Llama 2 model ("llama", then "llama2", until Dec 2024) converts to its shape. The keys
of its first months, before its public release (Apr 2024), stop with one line. scripts/convert_torchtitan_history.py
converts every llama file of a torchtitan clone's history.

`convert(toml_dict)` turns such a file into our sections and explains every key (scripts/convert_torchtitan_config.py
prints the explanations and writes the TOML). What each torchtitan key is here (the table the parser shares) is
torchtitan_keys.py.
The facts behind the table (keys, defaults, formulas of each era) were read from torchtitan's history;
docs/configuration.md "Coming from torchtitan" lists them.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from torchtitan.errors import UserError

from .job_config import Parallelism
from .torchtitan_keys import (
    _ANY,
    CONVERTER,
    ERAS,
    KEYS,
    _our_keys,
    flatten,
    suggested_output,  # noqa: F401  (the converter's API: scripts/convert_torchtitan_config.py)
)


class ConversionError(UserError):
    pass


# The last torchtitan defaults that differ from ours; written explicitly when the file leaves them unset.
# (key, {era: torchtitan's default}, our default, why it matters)
_DEFAULTS = [
    ("checkpoint.keep_latest_k", {"2024": 0, "2025": 10, "2026": 10}, 0, "torchtitan keeps the newest 10"),
    (
        "checkpoint.last_save_model_only",
        {"2024": False, "2025": True, "2026": True},
        False,
        "torchtitan's last checkpoint holds the weights only",
    ),
    ("activation_checkpoint.mode", dict.fromkeys(ERAS, "selective"), "none", "torchtitan's default AC"),
    ("training.steps", dict.fromkeys(ERAS, 10000), 1000, "torchtitan's default step count"),
    (
        "metrics.enable_tensorboard",
        dict.fromkeys(ERAS, False),
        True,
        "torchtitan writes no TensorBoard by default",
    ),
]

_MARKERS = {
    "2024": (
        "training.batch_size",
        "training.warmup_steps",
        "training.tensor_parallel_degree",
        "training.data_parallel_shard_degree",
        "experimental.pipeline_parallel_degree",
        "experimental.context_parallel_degree",
        "checkpoint.interval_type",
        "checkpoint.model_weights_only",
        "float8.enable_float8_linear",
        "model.norm_type",
    ),
    "2026": (
        "model.hf_assets_path",
        "checkpoint.enable",
        "compile.enable",
        "lr_scheduler.min_lr_factor",
        "validation.enable",
        "job.print_config",
        "quantize.linear.float8.filter_fqns",
    ),
    "2025": (
        "lr_scheduler.lr_min",
        "validation.enabled",
        "parallelism.tensor_parallel_degree",
        "training.local_batch_size",
        "checkpoint.last_save_model_only",
    ),
}

# torchtitan's flavors of llama3 that ours shares; their shape differences by era are written as overrides.
_FLAVORS = ("debugmodel", "8B", "70B", "405B")
# the schedules our config accepts (its Literal); those that hold several stages a rank are
# torchtitan.parallel.pipeline.SCHEDULES' second column (tests/test_torchtitan_compat.py checks the two agree)
_SCHEDULES = typing.get_args(typing.get_type_hints(Parallelism)["pipeline_parallel_schedule"])
_MULTI_STAGE = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def detect_era(keys: dict[str, Any]) -> tuple[str, str]:
    """(era, the key that decided it)."""
    for era in ("2024", "2026", "2025"):
        for k in _MARKERS[era]:
            if k in keys:
                return era, k
    return "2026", "no era-specific key (taken as the last TOML files)"


# ------------------------------------------------------------------------------------------------ conversion


@dataclass
class Conversion:
    era: str
    config: dict[str, dict[str, Any]]  # our section -> key -> value
    decisions: list[tuple[str, str]]  # (kind, one line)
    origin: dict[str, str]  # our "section.key" -> the torchtitan key it came from (for error messages)


class _Converter:
    def __init__(self, keys: dict[str, Any], era: str, source: str):
        self.keys, self.era, self.source = keys, era, source
        self.out: dict[str, dict[str, Any]] = {}
        self.decisions: list[tuple[str, str]] = []
        self.origin: dict[str, str] = {}

    def say(self, kind: str, text: str) -> None:
        self.decisions.append((kind, text))

    def fail(self, key: str, value, why: str):
        raise ConversionError(
            f"{self.source}: torchtitan's {key} = {_fmt(value)} cannot be expressed here: {why}"
        )

    def put(self, target: str, value, tt_key: str, kind: str | None = None, why: str = "") -> None:
        section, key = target.split(".", 1)
        self.out.setdefault(section, {})[key] = value
        self.origin[target] = tt_key
        if kind is None:
            if tt_key == target:
                kind = "kept" if self.keys.get(tt_key) == value else "mapped"
            elif tt_key.split(".")[0] == section:
                kind = "renamed"
            else:
                kind = "moved"
        if kind in ("default", "shape", "replaced") or tt_key not in self.keys:
            line = f"{target} = {_fmt(value)}"
        else:
            line = f"{tt_key} = {_fmt(self.keys[tt_key])}"
            if kind != "kept":
                line += f" -> {target} = {_fmt(value)}"
        self.say(kind, line + (f" ({why})" if why else ""))

    def get(self, target: str, default=None):
        section, key = target.split(".", 1)
        return self.out.get(section, {}).get(key, default)


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def convert(
    toml: dict, source: str = "config", era: str | None = None, tokenizer_path: str | None = None
) -> Conversion:
    """Our config sections for a torchtitan llama3 TOML (parsed), with one decision line per key and per
    difference in meaning. Raises ConversionError (one line) for a value that cannot be expressed here."""
    keys = flatten(toml)
    if era is None:
        era, why = detect_era(keys)
        detected = f"era {era}: detected from {why}"
    else:
        if era not in ERAS:
            raise ConversionError(f"--era {era!r} is not one of {', '.join(ERAS)}")
        detected = f"era {era}: given"
    c = _Converter(keys, era, source)
    c.say("info", detected)
    ours = _our_keys()

    for tt_key, value in keys.items():
        rule = KEYS.get(tt_key)
        if rule is None:
            if tt_key in ours:
                c.put(tt_key, value, tt_key)
                continue
            c.fail(tt_key, value, f"torchtitan option unknown to this converter; see `{CONVERTER} --help`")
        if rule.kind == "rename":
            c.put(rule.target, rule.fn(value) if rule.fn else value, tt_key, why=rule.note)
        elif rule.kind == "drop":
            if rule.ok is not _ANY and value not in rule.ok:
                c.fail(tt_key, value, rule.note)
            c.say("dropped", f"{tt_key} = {_fmt(value)}: already our behaviour: {rule.note}")
        elif rule.kind == "unsupported":
            if value not in rule.ok:
                c.fail(tt_key, value, f"not supported here; {rule.note}")
            c.say(
                "dropped", f"{tt_key} = {_fmt(value)}: torchtitan's default, nothing to carry ({rule.note})"
            )
        else:
            _CUSTOM[tt_key](c, tt_key, value)

    _model(c, tokenizer_path)
    _defaults(c)
    _warnings(c)
    _check(c)
    return Conversion(era, c.out, c.decisions, c.origin)


# ---- custom keys: each (converter, torchtitan key, value)


def _memory_snapshot(c: _Converter, k, v):
    if v:
        freq = c.keys.get("profiling.profile_freq", 10)
        c.put(
            "profiling.memory_snapshot_steps",
            [freq],
            k,
            "moved",
            "torchtitan snapshots memory every profile_freq steps; ours at the listed steps (and on OOM): list"
            " the steps you want",
        )
    else:
        c.say(
            "dropped",
            f"{k} = false: ours records no memory snapshot unless profiling.memory_snapshot_steps lists steps",
        )


def _hf_assets(c: _Converter, k, v):
    if "model.tokenizer_path" in c.keys and c.keys["model.tokenizer_path"] is not None:
        c.say("dropped", f"{k} = {_fmt(v)}: model.tokenizer_path is set and wins, as in torchtitan")
        return
    c.put(
        "model.tokenizer_path",
        v,
        k,
        why="the folder's tokenizer.json/tokenizer_config.json (or original/tokenizer.model) is read; its weights"
        " are not: convert them with scripts/convert_hf_to_dcp.py and set checkpoint.initial_load_path",
    )


def _converters(c: _Converter, k, v):
    names = list(v) if isinstance(v, list) else [v]
    for name in names:
        if name not in ("float8", "quantize.linear.float8"):
            c.fail(k, v, f"only float8 (torchao float8 training) is supported here; '{name}' is not")
    if names:
        c.put("float8.enable", True, k, "moved")
    else:
        c.say("dropped", f"{k} = []: no model converter, as here by default")


def _fused(c: _Converter, k, v):
    c.put("optimizer.implementation", "fused" if v else "foreach", k)


def _dataset(c: _Converter, k, v):
    path = c.keys.get("training.dataset_path")
    if v == "c4":
        c.put(
            "data.dataset",
            "c4",
            k,
            why="allenai/c4 'en', streamed from the Hugging Face Hub, as in torchtitan",
        )
    elif v in ("c4_test", "c4_mini"):
        c.put(
            "data.dataset",
            "debug_corpus",
            k,
            why=f"torchtitan's {v} is a small C4 extract shipped in its repository (tests/assets/{v}); ours ships"
            " debug_corpus (offline); to train on the same documents set data.dataset_path to"
            f" <torchtitan checkout>/tests/assets/{v}"
            + (" (done: training.dataset_path is set)" if path else ""),
        )
    elif v == "c4_validation":
        c.fail(k, v, "C4's validation split is held-out data: set it as validation.dataset")
    else:
        if path:
            c.say(
                "dropped", f"{k} = {_fmt(v)}: training.dataset_path names the files, which is all ours needs"
            )
            return
        c.fail(
            k,
            v,
            "not a dataset here; built-in sources are c4 and debug_corpus, or set data.dataset_path to its"
            " .json/.jsonl/.parquet/.txt files",
        )


def _val_dataset(c: _Converter, k, v):
    if v == "c4_validation":
        c.put("validation.dataset", "c4", k, why="C4 'en' validation split, as torchtitan's c4_validation")
        c.put("validation.split", "validation", k, "moved", "the split is its own key here")
    elif v in ("c4_test", "c4_mini"):
        c.put(
            "validation.dataset",
            "debug_corpus",
            k,
            why=f"ours has no {v}; debug_corpus ships a validation split",
        )
        c.put("validation.split", "validation", k, "moved", "the split is its own key here")
    elif v == "c4":
        c.put("validation.dataset", "c4", k, why="torchtitan read C4's train split: the data you train on")
        c.put("validation.split", "train", k, "moved", "the split is its own key here")
    elif c.keys.get("validation.dataset_path"):
        c.say("dropped", f"{k} = {_fmt(v)}: validation.dataset_path names the files")
    else:
        c.fail(k, v, "not a dataset here; built-in sources are c4 (split validation) and debug_corpus")


def _val_shape(c: _Converter, k, v):
    if k.endswith("local_batch_size"):
        train_key, train = "training.local_batch_size", c.get("training.local_batch_size", 8)
    else:
        train_key, train = "training.seq_len", c.get("training.seq_len", 2048)
    if v == train:
        c.say("dropped", f"{k} = {v}: ours validates with {train_key} = {train}, the same")
    elif c.keys.get("validation.enable", c.keys.get("validation.enabled", False)):
        c.fail(k, v, f"validation runs at {train_key} = {train} here (micro-batches of the training shape)")
    else:
        c.say("dropped", f"{k} = {v}: validation is off; when on, ours validates at {train_key} = {train}")


def _val_steps(c: _Converter, k, v):
    if v == -1:
        if c.keys.get("validation.enable", c.keys.get("validation.enabled", False)):
            c.fail(k, v, "ours validates a fixed number of batches (read once, kept in memory): set a count")
        c.say("dropped", f"{k} = -1 (whole split): validation is off; ours needs a count when it is on")
        return
    c.put("validation.steps", v, k)
    if v > 200:
        c.say(
            "warning",
            f"validation.steps = {v}: ours reads all validation batches once at start and keeps them in memory"
            " (steps x validation global batch x (seq_len + 1) int64 tokens per rank); lower it if that is large",
        )


def _async_tp(c: _Converter, k, v):
    if v:
        c.say(
            "unsupported",
            f"{k} = true: dropped; async tensor parallel is not applied by this trainer (TP runs synchronously);"
            " nearest: python -m torchtitan.estimate --estimate.async_tp=true shows what it would save",
        )
    else:
        c.say("dropped", f"{k} = false: already our behaviour (synchronous TP)")


def _async_mode(c: _Converter, k, v):
    if v == "async_with_pinned_mem":
        c.put("checkpoint.async_mode", "async", k, "renamed", "ours has no pinned-memory staging variant")
    else:
        c.put("checkpoint.async_mode", v, k)


def _schedule(c: _Converter, k, v):
    if v not in _SCHEDULES:
        c.fail(k, v, f"schedules here: {', '.join(_SCHEDULES)}")
    c.put("parallelism.pipeline_parallel_schedule", v, k)
    if v in _MULTI_STAGE:
        c.put(
            "parallelism.pipeline_parallel_stages_per_rank",
            2,
            k,
            "moved",
            "torchtitan gives multi-stage schedules 2 stages per rank unless told otherwise; ours says so here",
        )


def _microbatches(c: _Converter, k, v):
    if v is None:
        c.say(
            "dropped",
            f"{k} = none: ours splits the local batch into micro-batches of 1 by default, as torchtitan",
        )
        return
    batch = c.keys.get("training.batch_size", 8)
    if v < 1 or batch % v:
        c.fail(k, v, f"ours sets the micro-batch size; training.batch_size {batch} is not divisible by {v}")
    c.put(
        "parallelism.pipeline_parallel_microbatch_size",
        batch // v,
        k,
        "moved",
        f"{batch} / {v} micro-batches",
    )


def _recipe(c: _Converter, k, v):
    if v is None:
        c.say("dropped", f"{k} = none: tensorwise, our default too")
    elif v in ("tensorwise", "rowwise"):
        c.put("float8.recipe", v, k)
    else:
        c.fail(k, v, "recipes here: tensorwise, rowwise")


# The linear layers of torchtitan's llama3 model (its FQNs, which ours shares), up to the 126 blocks of 405B: a
# filter_fqns name skips every linear whose FQN contains it.
_BLOCK_LINEARS = [
    f"layers.{i}.{m}"
    for i in range(126)
    for m in ("attention.wq", "attention.wk", "attention.wv", "attention.wo")
    + ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
]


def _filter_fqns(c: _Converter, k, v):
    # a comma-separated string in torchtitan's files of early 2025 ("output"), a list later
    names = [n.strip() for n in v.split(",") if n.strip()] if isinstance(v, str) else list(v)
    skips = [
        n
        for n in names
        if n not in ("output", "auto_filter_small_kn") and any(n in f for f in _BLOCK_LINEARS)
    ]
    if skips:
        c.fail(k, v, "ours filters by size (float8.min_dim) and always skips the output head, not by name")
    unmatched = [n for n in names if n not in ("output", "auto_filter_small_kn")]
    c.say(
        "dropped",
        f"{k} = {_fmt(v)}: already our behaviour: the output head is never converted, and linears with a"
        " dimension below float8.min_dim (1024) stay in high precision"
        + (f" ({', '.join(unmatched)}: no linear of a Llama 3 model has that name)" if unmatched else ""),
    )


def _model_key(c: _Converter, k, v):
    """model.name / model.flavor: kept for a llama3 model; a Llama 2 model's are written by _llama2."""
    if c.keys.get("model.name", "llama3") == "llama3":
        c.put(k, v, k)


def _norm_type(c: _Converter, k, v):
    if v in ("rmsnorm", "fused_rmsnorm", "compiled_rmsnorm"):
        c.say(
            "dropped",
            f"{k} = {_fmt(v)}: RMSNorm, the only norm here"
            + (
                "; torchtitan's fused / compiled variants were kernels of the same norm (ours: torch's RMSNorm,"
                " fused by compile.enable)"
                if v != "rmsnorm"
                else ""
            ),
        )
    else:
        c.fail(k, v, "Llama uses RMSNorm; it is the only norm here")


def _fp8_linear(c: _Converter, k, v):
    """torchtitan's float8 switch of 2024: a string ("" or "dynamic") until 2024-07, then a bool meaning dynamic."""
    if v in ("", False):
        c.say("dropped", f"{k} = {_fmt(v)}: float8 off, as here by default")
    elif v in ("dynamic", True):
        c.put("float8.enable", True, k, "moved", "dynamic (tensorwise) scaling, as ours")
    else:
        c.fail(k, v, "ours scales dynamically (torchao's delayed scaling was removed)")


def _profiler_window(c: _Converter, k, v):
    default = 1 if k.endswith("active") else 3
    if v == default:
        c.say("dropped", f"{k} = {v}: torchtitan's default, the same window as ours")
    else:
        c.say(
            "unsupported",
            f"{k} = {v}: dropped; ours records one step per profiling.profile_freq window after a warm-up of its"
            " own (torchtitan's default window)",
        )


def _comm_mode(c: _Converter, k, v):
    """torchtitan's comm.mode (default / fake_backend / local_tensor): carried over when this project has the key."""
    if k in _our_keys() and v in ("default", "fake_backend"):
        c.put(k, v, k)
        if v == "fake_backend":
            c.say(
                "info",
                'comm.mode = "fake_backend": set comm.fake_world_size (and comm.fake_rank) for the world to'
                " simulate (docs/launching.md, 'Check a cluster config on one machine')",
            )
    elif v == "default":
        c.say("dropped", f"{k} = {_fmt(v)}: already our behaviour (real collectives)")
    else:
        c.fail(
            k, v, 'not supported here; nearest: comm.mode = "fake_backend" (one simulated rank, real compute)'
        )


def _memory_estimation(c: _Converter, k, v):
    c.say(
        "dropped",
        f"{k} = {_fmt(v)}: ours estimates memory without running: `python -m torchtitan.preflight` prints the"
        " per-device peak, `python -m torchtitan.estimate` the details",
    )


_CUSTOM = {
    "profiling.enable_memory_snapshot": _memory_snapshot,
    "model.hf_assets_path": _hf_assets,
    "model.converters": _converters,
    "optimizer.fused": _fused,
    "training.dataset": _dataset,
    "validation.dataset": _val_dataset,
    "validation.local_batch_size": _val_shape,
    "validation.seq_len": _val_shape,
    "validation.steps": _val_steps,
    "experimental.enable_async_tensor_parallel": _async_tp,
    "parallelism.enable_async_tensor_parallel": _async_tp,
    "checkpoint.async_mode": _async_mode,
    "experimental.pipeline_parallel_schedule": _schedule,
    "parallelism.pipeline_parallel_schedule": _schedule,
    "experimental.pipeline_parallel_microbatches": _microbatches,
    "comm.mode": _comm_mode,
    "memory_estimation.enabled": _memory_estimation,
    "memory_estimation.enable": _memory_estimation,
    "model.norm_type": _norm_type,
    "training.fp8_linear": _fp8_linear,
    "model.name": _model_key,
    "model.flavor": _model_key,
    "profiling.profiler_active": _profiler_window,
    "profiling.profiler_warmup": _profiler_window,
}
for _prefix in ("float8", "quantize.linear.float8", "quantize.dense.float8"):
    _CUSTOM[f"{_prefix}.recipe_name"] = _recipe
    _CUSTOM[f"{_prefix}.filter_fqns"] = _filter_fqns


# ---- the model: flavor shapes, RoPE scaling and vocabulary by era


# torchtitan's Llama 2 flavors: `llama_configs` while its model was named "llama" (to 2024-04-18), then
# `llama2_configs` under "llama2" until PR #712 removed them (2024-12-03), torchtitan/models/llama/__init__.py; its
# ModelArgs defaults fill the rest: FFN multiple_of 256 and no multiplier, RoPE theta 10,000, no GQA, norm eps 1e-5
# (ours too), the vocabulary from the tokenizer (Llama 2's sentencepiece model: 32,000).
_LLAMA2_FLAVORS = {
    "debugmodel": {"dim": 256, "n_layers": 8, "n_heads": 16},
    "271M": {"dim": 1024, "n_layers": 16, "n_heads": 8},
    "1B": {"dim": 2048, "n_layers": 18, "n_heads": 16},
    "7B": {"dim": 4096, "n_layers": 32, "n_heads": 32},
    "13B": {"dim": 5120, "n_layers": 40, "n_heads": 40},
    "26B": {"dim": 5120, "n_layers": 80, "n_heads": 40},
    "70B": {
        "dim": 8192,
        "n_layers": 80,
        "n_heads": 64,
        "n_kv_heads": 8,
        "ffn_dim_multiplier": 1.3,
        "multiple_of": 4096,
    },
}
LLAMA2_VOCAB = 32000


def _llama2(c: _Converter, name: str, flavor: str) -> None:
    """A torchtitan Llama 2 model ("llama" / "llama2"): our llama3 model with the flavor's shape written out."""
    if flavor not in _LLAMA2_FLAVORS:
        c.fail("model.flavor", flavor, f"torchtitan's Llama 2 flavors: {', '.join(_LLAMA2_FLAVORS)}")
    shape = dict(_LLAMA2_FLAVORS[flavor])
    if flavor == "debugmodel" and name == "llama":
        shape["n_layers"] = 2  # 8 layers only from 2024-06-17 (torchtitan ae3d2a9bc)
    shape.setdefault("n_kv_heads", shape["n_heads"])
    c.put("model.name", "llama3", "model.name", "renamed",
          f"torchtitan's {name} model is the same Transformer with Llama 2's shapes; written out below")  # fmt: skip
    c.put("model.flavor", "custom", "model.flavor", "renamed", f"torchtitan's {name} {flavor}")
    for key, value in shape.items():
        c.put(f"model.{key}", value, "model.flavor", "shape", f"torchtitan's {name} {flavor}")
    c.put("model.rope_theta", 10000.0, "model.flavor", "shape", "Llama 2's RoPE base")
    if flavor == "debugmodel" and name == "llama2":
        c.say(
            "info",
            "torchtitan's Llama 2 debugmodel had 2 layers before 2024-06-17: set model.n_layers = 2 for such a file",
        )


def _model(c: _Converter, tokenizer_override: str | None) -> None:
    name = c.keys.get("model.name", "llama3")
    if name not in ("llama3", "llama", "llama2"):
        c.fail(
            "model.name", name, "torchtitan's llama3 and Llama 2 (llama / llama2) models are supported here"
        )
    flavor = c.keys.get("model.flavor", "debugmodel")
    llama2 = name != "llama3"
    if llama2:
        _llama2(c, name, flavor)
    elif flavor not in _FLAVORS:
        c.fail(
            "model.flavor",
            flavor,
            f"flavors shared with torchtitan: {', '.join(_FLAVORS)} (flex/varlen attention variants are not here)",
        )
    if tokenizer_override:
        c.put(
            "model.tokenizer_path", tokenizer_override, "model.tokenizer_path", "replaced", "--tokenizer-path"
        )
    elif c.get("model.tokenizer_path") is None:
        default = (
            "./tests/assets/tokenizer"
            if c.era == "2026"
            else "./torchtitan/datasets/tokenizer/tokenizer.model"
        )
        c.put(
            "model.tokenizer_path",
            default,
            "model.tokenizer_path",
            "default",
            "torchtitan's default tokenizer",
        )
    tok_path = c.get("model.tokenizer_path")
    c.say(
        "info",
        f"model.tokenizer_path {tok_path}: read as a tiktoken file (Meta's Llama 3 tokenizer.model), a Hugging"
        " Face tokenizer.json folder or a sentencepiece model; a relative path is taken from where you launch",
    )
    scaled = c.era == "2026"
    if llama2:
        _vocab_from_tokenizer(c, tok_path, f"torchtitan's {name} model took its vocabulary size from the tokenizer",
                              fallback=LLAMA2_VOCAB)  # fmt: skip
    elif flavor == "debugmodel":
        c.put(
            "model.n_kv_heads",
            16,
            "model.flavor",
            "shape",
            "torchtitan's debugmodel has 16 key/value heads (no GQA); ours has 4: delete this line for ours",
        )
        _debug_layers(c)
        if scaled:
            c.put(
                "model.rope_scaling_factor",
                8.0,
                "model.flavor",
                "shape",
                "torchtitan applied Llama 3.1 RoPE scaling (factor 8) to every llama3 flavor from PR #1839"
                " (Oct 2025); ours scales none of the debug flavors; a checkout older than that: use 1.0",
            )
        _debug_vocab(c, tok_path)
    elif not scaled:
        c.put(
            "model.rope_scaling_factor",
            1.0,
            "model.flavor",
            "shape",
            f"torchtitan's {flavor} had no RoPE scaling before PR #1839 (Oct 2025); ours scales it by 8 as Llama 3.1"
            " does: delete this line for ours",
        )
    else:
        c.say(
            "info", f"model.flavor {flavor}: Llama 3.1 RoPE scaling (factor 8), as in torchtitan's last files"
        )


def _debug_layers(c: _Converter) -> None:
    """torchtitan's llama3 debugmodel had 2 blocks until 2024-06-16, 8 from ae3d2a9bc (2024-06-17) and 6, as ours,
    from f64cf3c18 (2025-04-15). The era's keys date a file: the 2024 keys end in 2025-03, training.batch_size in
    2025-06 (training.local_batch_size from 2025-06-05)."""
    if c.era == "2024":
        c.put("model.n_layers", 8, "model.flavor", "shape",
              "torchtitan's debugmodel had 8 blocks from 2024-06-17 to 2025-04-14 (6 since, as ours); a file older than"
              " 2024-06-17 had 2: set 2 for it")  # fmt: skip
    elif c.era == "2025" and "training.batch_size" in c.keys:
        c.say("info", "model.n_layers: torchtitan's debugmodel had 8 blocks until 2025-04-14 and 6 (ours) since; a file"
              " of before 2025-04-15 needs model.n_layers = 8")  # fmt: skip


def _debug_vocab(c: _Converter, tok_path: str) -> None:
    """torchtitan's debugmodel took its vocabulary size from the tokenizer (fixed 2,048 in its last files, with
    a smaller test tokenizer); ours has 2,048 and requires the tokenizer's size exactly."""
    why = (
        "torchtitan's debugmodel took its vocabulary size from the tokenizer"
        if c.era != "2026"
        else "torchtitan's debugmodel had 2,048 embedding rows whatever the tokenizer's size; ours needs exactly"
        " the tokenizer's size"
    )
    _vocab_from_tokenizer(c, tok_path, why)


def _vocab_from_tokenizer(c: _Converter, tok_path: str, why: str, fallback: int | None = None) -> None:
    """model.vocab_size = the tokenizer's size (ours requires it exactly); when the tokenizer cannot be read here,
    `fallback` with a warning, or no line and a warning."""
    from torchtitan.data.tokenizer import build_tokenizer

    if c.get("model.vocab_size") is not None:
        return
    try:
        size = build_tokenizer(tok_path).vocab_size
    except UserError as e:
        if fallback is None:
            c.say(
                "warning",
                f"model.vocab_size not written: the tokenizer could not be read here ({e}); our debugmodel has"
                " 2,048 tokens and must match the tokenizer: set model.vocab_size (preflight tells the size) or"
                " convert again with --tokenizer-path",
            )
            return
        c.put("model.vocab_size", fallback, "model.flavor", "shape",
              f"the tokenizer could not be read here ({e}); {fallback:,} is Llama 2's: check it, or convert again"
              " with --tokenizer-path")  # fmt: skip
        return
    c.put("model.vocab_size", size, "model.flavor", "shape", f"{why}: {tok_path} has {size}")


def _defaults(c: _Converter) -> None:
    for key, by_era, ours, why in _DEFAULTS:
        theirs = by_era[c.era]
        if theirs == ours or c.get(key) is not None or key in c.keys:
            continue
        c.put(key, theirs, key, "default", f"unset in the file: {why}; ours defaults to {_fmt(ours)}")
    if (
        c.get("activation_checkpoint.mode") == "selective"
        and "activation_checkpoint.selective_ac_option" not in c.keys
    ):
        c.put(
            "activation_checkpoint.selective_ac_option",
            "2",
            "activation_checkpoint.selective_ac_option",
            "default",
            "unset in the file: torchtitan's default is '2' (every 2nd block), ours 'op'",
        )
    if c.get("checkpoint.enable") and c.get("checkpoint.interval") is None:
        pass  # 500 in both


def _warnings(c: _Converter) -> None:
    warmup = c.get("lr_scheduler.warmup_steps", 200)
    if c.era != "2024" and warmup:
        c.say(
            "warning",
            f"lr_scheduler.warmup_steps = {warmup}: the warmup factor at step s is s/(w+1) here (as in torchtitan's 2024"
            f" files) but s/w in torchtitan's later ones: the first {warmup} steps run at w/(w+1) ="
            f" {warmup / (warmup + 1):.3f} of its learning rate, the same from step {warmup + 1} on",
        )
    c.say(
        "warning",
        f"optimizer.weight_decay = {c.get('optimizer.weight_decay', 0.1)}: applied to weight matrices only here;"
        " torchtitan decays every parameter, norms and embeddings included (no option reproduces that)",
    )
    if (
        c.get("activation_checkpoint.mode") == "selective"
        and c.get("activation_checkpoint.selective_ac_option") == "op"
    ):
        c.say(
            "info",
            "activation_checkpoint selective 'op': the same per-op policy as torchtitan's (matmul, attention,"
            " float8 amax and TP reduce-scatter outputs saved, every second matmul of a block recomputed)",
        )
    if c.get("float8.enable"):
        c.say(
            "warning",
            "float8: ours skips linears with a dimension below float8.min_dim (1024) and the output head;"
            " torchtitan converted every linear its filter_fqns did not name",
        )
    if "training.seed" not in c.origin:
        c.say(
            "info",
            "training.seed: unset in the file (torchtitan then fixes no seed); ours seeds 0 by default",
        )


def _check(c: _Converter) -> None:
    """Every value must be one of ours (type, allowed strings) and the whole must pass our validation."""
    from . import manager
    from .job_config import JobConfig

    cfg = JobConfig()
    for section, table in c.out.items():
        for key, value in table.items():
            try:
                manager._set(cfg, section, key, value, "converted", from_cli=False)
            except UserError as e:
                tt = c.origin.get(f"{section}.{key}", f"{section}.{key}")
                c.fail(tt, c.keys.get(tt, value), str(e).removeprefix("converted: "))
    try:
        manager.validate(cfg)
    except UserError as e:
        raise ConversionError(f"{c.source}: after conversion: {e}") from None


def to_toml(conv: Conversion, source: str) -> str:
    """Our TOML, sections and keys in JobConfig order, the decisions as comments on top."""
    from . import manager
    from .job_config import JobConfig

    hints = typing.get_type_hints(JobConfig)
    lines = [
        f"# Converted from the torchtitan config {source} (era {conv.era}) by {CONVERTER}.",
        "# Decisions (see docs/configuration.md, 'Coming from torchtitan'):",
    ]
    lines += [f"#   {kind:<11} {text}" for kind, text in conv.decisions]
    for f in dataclasses.fields(JobConfig):
        table = conv.config.get(f.name)
        if not table:
            continue
        lines += ["", f"[{f.name}]"]
        for g in dataclasses.fields(hints[f.name]):
            if g.name in table and table[g.name] is not None:
                lines.append(f"{g.name} = {manager._toml_value(table[g.name])}")
    return "\n".join(lines) + "\n"
