"""Parse a JobConfig from a TOML file plus `--section.key=value` overrides.

Precedence: command line > TOML file > dataclass default. Parsing is strict: unknown sections or keys, and
values of the wrong type, raise ConfigError (a UserError: one line, exit code 2) naming the key, the value,
the expected type, and the closest valid key when there is one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import sys
import types
import typing
from typing import Any, Literal, Union

from torchtitan.errors import UserError

from . import torchtitan_keys
from .job_config import JobConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


class ConfigError(UserError):
    pass


_NONE_WORDS = {"none", "null"}
_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}


# The schema is fixed at import, so it is read once: typing.get_type_hints compiles every string annotation (this
# module's `from __future__ import annotations`) each time it is called: 17 ms a parse here before, 0.6 ms
# since (the estimator parses one config per reference row). Callers treat both dicts as read-only.
@functools.cache
def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(JobConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(JobConfig)}


@functools.cache
def _fields(section_cls: type) -> dict[str, tuple[Any, dataclasses.Field]]:
    hints = typing.get_type_hints(section_cls, include_extras=True)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(section_cls)}


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid: {', '.join(sorted(choices))}"


def _suggest_key(name: str, choices) -> str:
    """The did-you-mean of an unknown key or section: torchtitan's names first (they answer with their equivalent
    here, never with a look-alike of another meaning: checkpoint.enable_checkpoint is not create_seed_checkpoint),
    then the closest of our names."""
    known = torchtitan_keys.hint(name)
    if known:
        return f"; {known}"
    choices = list(choices)
    close = difflib.get_close_matches(name, choices + list(torchtitan_keys.KEYS), n=1, cutoff=0.5)
    if close and close[0] not in choices:  # closest to a torchtitan name: a misspelt one of those
        return f"; {torchtitan_keys.hint(close[0])}"
    return _suggest(name, choices)


def type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    return "None" if tp is type(None) else tp.__name__


def _convert(value: Any, tp, from_cli: bool):
    """Convert `value` (a TOML value, or a string from the command line) to type `tp`; raise ValueError if it isn't one."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (value is None or (from_cli and str(value).strip().lower() in _NONE_WORDS)):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, from_cli)
            except ValueError:
                pass
        raise ValueError
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ValueError
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                text = text[1:-1] if text.endswith("]") else text[1:]
            value = [v.strip().strip("'\"") for v in text.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ValueError
        return [_convert(v, item_tp, from_cli) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and str(value).lower() in _TRUE_WORDS | _FALSE_WORDS:
            return str(value).lower() in _TRUE_WORDS
        raise ValueError
    if tp is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if from_cli:
            return int(str(value).replace("_", ""))
        raise ValueError
    if tp is float:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, (int, float)):
            return float(value)
        if from_cli:
            return float(value)
        raise ValueError
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    raise TypeError(f"unsupported config type {tp}")  # a bug in job_config.py, not user input


def _set(cfg: JobConfig, section: str, key: str, value: Any, source: str, from_cli: bool) -> None:
    sections = _sections()
    if section not in sections:
        raise ConfigError(f"{source}: unknown section '{section}'{_suggest_key(section, sections)}")
    fields = _fields(sections[section])
    if key not in fields:
        full = [f"{section}.{k}" for k in fields]
        raise ConfigError(f"{source}: unknown key '{section}.{key}'{_suggest_key(f'{section}.{key}', full)}")
    tp = fields[key][0]
    try:
        converted = _convert(value, tp, from_cli)
    except ValueError:
        raise ConfigError(f"{source}: '{section}.{key}' got {value!r}, expected {type_name(tp)}") from None
    setattr(getattr(cfg, section), key, converted)


def _load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    # empty: a truncated download or a failed redirect would otherwise run every default (the debug model)
    if not data:
        raise ConfigError(
            f"{path}: the config file holds no settings (empty or only comments); give one with its sections,"
            " e.g. train_configs/debug_model.toml, or leave --job.config_file out to run the defaults"
        )
    return data


def _split_cli(argv: list[str]) -> list[tuple[str, str]]:
    """['--a.b=1', '--c.d', '2', '--flag'] -> [('a.b', '1'), ('c.d', '2'), ('flag', 'true')]."""
    pairs, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"command line: unexpected argument '{arg}'; options look like --section.key=value"
            )
        name = arg[2:]
        if "=" in name:
            name, value = name.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            i += 1
            value = argv[i]
        else:
            value = "true"  # a bare flag: `--checkpoint.enable`
        pairs.append((name, value))
        i += 1
    return pairs


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Build the JobConfig from defaults, then the TOML file (if any), then the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pairs = _split_cli(argv)
    registry = torchtitan_keys.registry_hint(dict(pairs))
    if registry:
        raise ConfigError(f"command line: {registry}")
    cfg = JobConfig()

    config_file = None
    for name, value in pairs:
        if name == "job.config_file":
            config_file = value
    if config_file:
        toml = _load_toml(config_file)
        _refuse_torchtitan_file(toml, config_file)
        apply_sections(cfg, toml, config_file)
        cfg.job.config_file = config_file

    for name, value in pairs:
        if "." not in name:
            raise ConfigError(
                f"command line: '--{name}' is not of the form --section.key{_suggest(name, _sections())}"
            )
        section, key = name.split(".", 1)
        _set(cfg, section, key, value, "command line", from_cli=True)
    return cfg


def apply_sections(cfg: JobConfig, sections: dict, source: str) -> JobConfig:
    """Set every key of a parsed config file ({section: {key: value}}) on `cfg`, checked as the file's are."""
    for section, table in sections.items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"{source}: top-level key '{section}' must be a [section] table{_suggest(section, _sections())}"
            )
        for key, value in table.items():
            _set(cfg, section, key, value, source, from_cli=False)
    return cfg


def _refuse_torchtitan_file(toml: dict, path: str) -> None:
    """A torchtitan config (two or more of its own keys) gets one line: what it is and the converter command.
    A single torchtitan key in one of our files is answered key by key (_suggest_key)."""
    found = torchtitan_keys.torchtitan_file_keys(toml)
    if found:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ConfigError(
            f"{path} is a torchtitan config ({shown} are torchtitan's keys); convert it first:"
            f" {torchtitan_keys.CONVERTER} {path} -o {torchtitan_keys.suggested_output(path)}"
        )


def to_dict(cfg: JobConfig) -> dict:
    return dataclasses.asdict(cfg)


def to_toml(cfg: JobConfig) -> str:
    """Serialize the effective config as TOML; `parse_args(['--job.config_file', f])` on it gives `cfg` back.

    TOML has no null: a None field is written as a comment, which leaves it at its default (None) on reload.
    """
    lines = []
    for section, table in to_dict(cfg).items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            if value is None:
                lines.append(f"# {key} = None")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def help_text() -> str:
    """Every option with its type, default and help, section by section."""
    out = [
        "usage: train.py [--job.config_file FILE] [--section.key=value ...]",
        "",
        "Precedence: command line > TOML file > default. Booleans: true/false; lists: a,b,c; None: none.",
    ]
    for section, cls in _sections().items():
        out.append(f"\n[{section}]")
        for key, (tp, f) in _fields(cls).items():
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            name = f"--{section}.{key}"
            out.append(f"  {name:<46} {f.metadata['help']} (type: {type_name(tp)}; default: {default!r})")
    return "\n".join(out)


def validate(cfg: JobConfig) -> None:
    """Checks of single values and of values against each other that need no world size or files."""

    def need(ok: bool, key: str, value, what: str):
        if not ok:
            raise ConfigError(f"'{key}' = {value!r} is invalid: {what}")

    t, m, o, s = cfg.training, cfg.metrics, cfg.optimizer, cfg.lr_scheduler
    need(t.steps >= 1, "training.steps", t.steps, "must be >= 1")
    need(t.local_batch_size >= 1, "training.local_batch_size", t.local_batch_size, "must be >= 1")
    need(t.seq_len >= 2, "training.seq_len", t.seq_len, "must be >= 2")
    need(
        t.global_batch_size == -1 or t.global_batch_size >= 1,
        "training.global_batch_size",
        t.global_batch_size,
        "must be >= 1, or -1 for local_batch_size x dp",
    )
    need(t.gc_freq >= 0, "training.gc_freq", t.gc_freq, "must be >= 0 (0 leaves automatic GC on)")
    need(o.lr >= 0, "optimizer.lr", o.lr, "must be >= 0")
    need(0 <= o.beta1 < 1, "optimizer.beta1", o.beta1, "must be in [0, 1)")
    need(0 <= o.beta2 < 1, "optimizer.beta2", o.beta2, "must be in [0, 1)")
    need(o.eps > 0, "optimizer.eps", o.eps, "must be > 0")
    need(o.weight_decay >= 0, "optimizer.weight_decay", o.weight_decay, "must be >= 0")
    need(s.warmup_steps >= 0, "lr_scheduler.warmup_steps", s.warmup_steps, "must be >= 0")
    need(
        s.decay_ratio is None or 0 <= s.decay_ratio <= 1,
        "lr_scheduler.decay_ratio",
        s.decay_ratio,
        "must be in [0, 1]",
    )
    need(0 <= s.min_lr_factor <= 1, "lr_scheduler.min_lr_factor", s.min_lr_factor, "must be in [0, 1]")
    d = cfg.data.num_shards
    need(d is None or d >= 1, "data.num_shards", d, "must be >= 1 or none (one shard per data-parallel rank)")
    need(m.log_freq >= 1, "metrics.log_freq", m.log_freq, "must be >= 1")
    need(
        m.peak_tflops is None or m.peak_tflops > 0,
        "metrics.peak_tflops",
        m.peak_tflops,
        "must be > 0 or none",
    )
    need(
        cfg.profiling.profile_freq >= 1, "profiling.profile_freq", cfg.profiling.profile_freq, "must be >= 1"
    )
    need(
        not m.enable_wandb or importlib.util.find_spec("wandb") is not None,
        "metrics.enable_wandb",
        m.enable_wandb,
        "the wandb package is not installed (pip install wandb; it is in the dev extras)",
    )
    need(m.straggler_factor > 1, "metrics.straggler_factor", m.straggler_factor, "must be > 1")
    snaps = cfg.profiling.memory_snapshot_steps
    need(all(s >= 1 for s in snaps), "profiling.memory_snapshot_steps", snaps, "steps must be >= 1")
    v = cfg.validation
    need(v.freq >= 1, "validation.freq", v.freq, "must be >= 1")
    need(v.steps >= 1, "validation.steps", v.steps, "must be >= 1")
    need(
        v.global_batch_size == -1 or v.global_batch_size >= 1,
        "validation.global_batch_size",
        v.global_batch_size,
        "must be >= 1, or -1 for the training global batch",
    )
    need(
        not (v.enable and cfg.data.dataset_path and not v.dataset_path),
        "validation.dataset_path",
        v.dataset_path,
        f"data.dataset_path={cfg.data.dataset_path!r} trains on your files, so validation needs held-out files"
        " of its own (set validation.dataset_path) or validation.enable=false",
    )
    need(cfg.checkpoint.interval >= 1, "checkpoint.interval", cfg.checkpoint.interval, "must be >= 1")
    c = cfg.checkpoint
    need(c.keep_latest_k >= 0, "checkpoint.keep_latest_k", c.keep_latest_k, "must be >= 0 (0 keeps all)")
    need(c.load_step >= -1, "checkpoint.load_step", c.load_step, "must be >= 0, or -1 for the latest")
    need(
        cfg.comm.init_timeout_seconds > 0,
        "comm.init_timeout_seconds",
        cfg.comm.init_timeout_seconds,
        "must be > 0",
    )
    need(
        cfg.comm.train_timeout_seconds > 0,
        "comm.train_timeout_seconds",
        cfg.comm.train_timeout_seconds,
        "must be > 0",
    )
    need(
        cfg.comm.watchdog_timeout_seconds >= 0,
        "comm.watchdog_timeout_seconds",
        cfg.comm.watchdog_timeout_seconds,
        "must be >= 0 (0 turns the watchdog off)",
    )
    need(
        cfg.job.expected_nodes is None or cfg.job.expected_nodes >= 1,
        "job.expected_nodes",
        cfg.job.expected_nodes,
        "must be >= 1 or none",
    )
    ac = cfg.activation_checkpoint
    opt_ok = ac.selective_ac_option == "op" or (
        ac.selective_ac_option.isdigit() and int(ac.selective_ac_option) >= 1
    )
    need(
        ac.mode != "selective" or opt_ok,
        "activation_checkpoint.selective_ac_option",
        ac.selective_ac_option,
        "must be 'op' or a positive integer N as a string ('2' = every 2nd block)",
    )
    f8 = cfg.float8
    need(
        f8.min_dim >= 16,
        "float8.min_dim",
        f8.min_dim,
        "must be >= 16 (float8 matmuls need dims divisible by 16)",
    )
    need(
        not (f8.enable and f8.enable_fsdp_float8_all_gather and f8.recipe != "tensorwise"),
        "float8.enable_fsdp_float8_all_gather",
        f8.enable_fsdp_float8_all_gather,
        f"torchao supports float8 all-gather only with recipe = 'tensorwise' (recipe is {f8.recipe!r})",
    )
    need(
        not (
            f8.enable and f8.precompute_float8_dynamic_scale_for_fsdp and not f8.enable_fsdp_float8_all_gather
        ),
        "float8.precompute_float8_dynamic_scale_for_fsdp",
        f8.precompute_float8_dynamic_scale_for_fsdp,
        "needs float8.enable_fsdp_float8_all_gather = true (the scales it precomputes are for that all-gather)",
    )
    need(
        not cfg.compile.enable or len(cfg.compile.components) > 0,
        "compile.components",
        cfg.compile.components,
        "must name at least one of model, loss when compile.enable = true",
    )
    p = cfg.parallelism
    for key in (
        "data_parallel_replicate_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "context_parallel_degree",
    ):
        need(getattr(p, key) >= 1, f"parallelism.{key}", getattr(p, key), "must be >= 1")
    need(
        p.data_parallel_shard_degree == -1 or p.data_parallel_shard_degree >= 1,
        "parallelism.data_parallel_shard_degree",
        p.data_parallel_shard_degree,
        "must be >= 1, or -1 for 'the rest of the world'",
    )
