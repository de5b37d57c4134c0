"""Model registry: a plain dict from model name to (model class, flavors)."""

import dataclasses

from torchtitan.errors import UserError
from torchtitan.models.llama3 import ModelArgs, RopeScaling, Transformer, get_model_args, llama3_flavors

MODELS = {"llama3": (Transformer, llama3_flavors)}


def build_model_args(name: str, flavor: str, **overrides) -> ModelArgs:
    """A fresh ModelArgs for model `name`, flavor `flavor`, with optional field overrides (e.g. max_seq_len).

    Raises UserError for an unknown name, flavor or override, listing the valid values.
    """
    if name not in MODELS:
        raise UserError(f"model.name={name!r} is not a known model; valid: {', '.join(MODELS)}")
    return get_model_args(flavor, **overrides)  # llama3 is the only model, so its args builder serves all


def get_model_class(name: str):
    if name not in MODELS:
        raise UserError(f"model.name={name!r} is not a known model; valid: {', '.join(MODELS)}")
    return MODELS[name][0]


# [model] shape fields -> ModelArgs fields (the TOML name says what it is; ModelArgs keeps Meta's names)
_SHAPE_FIELDS = {
    "dim": "dim",
    "n_layers": "n_layers",
    "n_heads": "n_heads",
    "n_kv_heads": "n_kv_heads",
    "vocab_size": "vocab_size",
    "ffn_hidden_dim": "ffn_dim",
    "ffn_dim_multiplier": "ffn_dim_multiplier",
    "multiple_of": "multiple_of",
    "norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
    "tie_embeddings": "tie_embeddings",
}
_ROPE_FIELDS = {
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_position_embeddings": "original_max_position_embeddings",
}
_CUSTOM_REQUIRED = ("dim", "n_layers", "n_heads", "vocab_size")


def _shape_overrides(model_cfg) -> dict:
    """ModelArgs overrides from the [model] shape fields that are set (None = keep the flavor's value)."""
    overrides = {
        arg: getattr(model_cfg, key)
        for key, arg in _SHAPE_FIELDS.items()
        if getattr(model_cfg, key) is not None
    }
    factor = model_cfg.rope_scaling_factor
    rope_extra = {
        arg: getattr(model_cfg, key)
        for key, arg in _ROPE_FIELDS.items()
        if getattr(model_cfg, key) is not None
    }
    if factor is not None and factor <= 0:
        raise UserError(f"model.rope_scaling_factor={factor} must be > 0 (1.0 = no scaling)")
    if factor == 1.0:  # factor 1 leaves every frequency unchanged: the same model as no scaling, exactly
        overrides["rope_scaling"] = None
    elif factor is not None:
        overrides["rope_scaling"] = RopeScaling(factor=factor, **rope_extra)
    elif rope_extra:
        overrides["rope_scaling_extra"] = rope_extra  # applied to the flavor's scaling below
    return overrides


def model_args_from_config(model_cfg, seq_len: int) -> ModelArgs:
    """ModelArgs for the [model] section: the flavor, then every shape field that is set, then max_seq_len.

    flavor = "custom" starts from no flavor: dim, n_layers, n_heads and vocab_size must be given, the other fields
    take ModelArgs' defaults (n_kv_heads = n_heads: no grouped-query attention).
    The RoPE table must cover training.seq_len; it defaults to the flavor's length, grown to seq_len if shorter.
    """
    overrides = _shape_overrides(model_cfg)
    rope_extra = overrides.pop("rope_scaling_extra", None)
    if model_cfg.name not in MODELS:
        raise UserError(f"model.name={model_cfg.name!r} is not a known model; valid: {', '.join(MODELS)}")
    if model_cfg.flavor == "custom":
        missing = [k for k in _CUSTOM_REQUIRED if getattr(model_cfg, k) is None]
        if missing:
            raise UserError(
                f"model.flavor='custom' needs the model's shape: set {', '.join('model.' + k for k in missing)}"
            )
        overrides.setdefault("n_kv_heads", overrides["n_heads"])
        args = ModelArgs(**overrides)
    else:
        args = build_model_args(model_cfg.name, model_cfg.flavor, **overrides)
    if rope_extra:
        if args.rope_scaling is None:
            raise UserError(
                f"model.{next(k for k, v in _ROPE_FIELDS.items() if v in rope_extra)} is set but the model has no"
                " RoPE scaling; set model.rope_scaling_factor too"
            )
        args.rope_scaling = dataclasses.replace(args.rope_scaling, **rope_extra)
    if model_cfg.max_seq_len is not None:
        if model_cfg.max_seq_len < seq_len:
            raise UserError(
                f"model.max_seq_len={model_cfg.max_seq_len} is shorter than training.seq_len={seq_len};"
                f" set model.max_seq_len >= {seq_len} or leave it unset"
            )
        args.max_seq_len = model_cfg.max_seq_len
    else:
        args.max_seq_len = max(args.max_seq_len, seq_len)
    return args
