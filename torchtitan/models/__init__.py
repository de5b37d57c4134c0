"""Model registry: a plain dict from model name to (model class, flavors)."""

from torchtitan.errors import UserError
from torchtitan.models.llama3 import ModelArgs, Transformer, get_model_args, llama3_flavors

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


def model_args_from_config(model_cfg, seq_len: int) -> ModelArgs:
    """ModelArgs for the [model] section: the flavor plus its vocab_size / max_seq_len overrides.

    The RoPE table must cover training.seq_len; it defaults to the flavor's length, grown to seq_len if shorter.
    """
    overrides = {}
    if model_cfg.vocab_size is not None:
        overrides["vocab_size"] = model_cfg.vocab_size
    args = build_model_args(model_cfg.name, model_cfg.flavor, **overrides)
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
