"""Does a checkpoint belong to this run? The model and tokenizer recorded in its marker, checked before loading.

A save records the run's identity (model name, flavor and ModelArgs; the tokenizer's path, size and checksum)
in COMMITTED.json. Before the model is built (`check_resume_target`) and again at load, every parameter of the
model this run builds must exist in the checkpoint with the same global shape, and a replaced tokenizer is named
as such; a mismatch is one line saying which flag (model.flavor, model.vocab_size, model.tokenizer_path) would
make the run load it, instead of a traceback from DCP or silently wrong weights.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchtitan.checkpoint.checksums import file_checksum
from torchtitan.checkpoint.folder import checkpoint_to_load
from torchtitan.checkpoint.integrity import verify_checkpoint
from torchtitan.errors import UserError
from torchtitan.log import logger


def run_identity(cfg, tokenizer) -> dict:
    """What a checkpoint belongs to, recorded in its marker and compared on load: the model and tokenizer."""
    from torchtitan.models import model_args_from_config

    m = cfg.model
    args = model_args_from_config(m, cfg.training.seq_len)
    out = {"model": {"name": m.name, "flavor": m.flavor, "args": dataclasses.asdict(args)}}
    if tokenizer is not None and os.path.isfile(getattr(tokenizer, "path", "")):
        out["tokenizer"] = {
            "path": os.path.abspath(tokenizer.path),
            "vocab_size": tokenizer.vocab_size,
            "checksum": file_checksum(tokenizer.path),
        }
    return out


def read_metadata(path: str):
    try:
        return dcp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise UserError(
            f"checkpoint file {os.path.join(path, '.metadata')} is unreadable ({type(e).__name__}: {e})"[:500]
        ) from None


def check_resume_target(cfg, tokenizer) -> None:
    """Every rank, before the model is built: the checkpoint this run will load (if any) is complete (sizes) and
    belongs to this run's model and tokenizer; else one line (exit 2) at once, not after minutes of building and
    initializing a model that cannot load it. Reads only the marker and DCP's .metadata."""
    picked = (
        None if cfg.checkpoint.create_seed_checkpoint else checkpoint_to_load(cfg)
    )  # a seed run loads nothing
    if picked is None:
        return
    path, initial = picked
    check_compatible(
        cfg, run_identity(cfg, tokenizer), path, verify_checkpoint(path), read_metadata(path), initial
    )


def warn_tokenizer_content(identity: dict, path: str, marker: dict, rank: int) -> None:
    """A warning (rank 0) when the tokenizer has the checkpoint's vocabulary size but other content."""
    saved, now = marker.get("tokenizer"), identity.get("tokenizer")
    if saved and now and saved["checksum"] != now["checksum"] and rank == 0:
        logger.warning(
            f"tokenizer {now['path']} differs from the one checkpoint {path} was trained with ({saved['path']},"
            f" also {saved['vocab_size']} tokens, other content): token ids may now stand for other text"
        )


def check_compatible(cfg, identity: dict, path: str, marker: dict, meta, initial: bool) -> None:
    """The checkpoint must belong to this run's model and tokenizer: else one line naming the difference."""
    saved, now = marker.get("tokenizer"), identity.get("tokenizer")
    if saved and now and saved["path"] == now["path"] and saved["vocab_size"] != now["vocab_size"]:
        raise UserError(  # the same file, replaced: that is the cause, whatever the model check would say
            f"tokenizer changed since checkpoint {path} was written: it was trained with {saved['path']}"
            f" ({saved['vocab_size']} tokens), this run uses {now['path']} ({now['vocab_size']} tokens);"
            " restore the original tokenizer file, or start a new run in another job.dump_folder"
        )
    _check_model(cfg, identity, path, marker, meta, initial)


def _check_model(cfg, identity: dict, path: str, marker: dict, meta, initial: bool) -> None:
    """Every parameter of the model this run builds must exist in the checkpoint with the same global shape,
    and the checkpoint must hold no other: else one line naming the first difference and what to change."""
    from torchtitan.models import get_model_class, model_args_from_config

    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    with torch.device("meta"):  # the whole model, whatever part of it this rank holds: no memory used
        ours = {k: list(v.shape) for k, v in get_model_class(cfg.model.name)(args).state_dict().items()}
    theirs = {
        k.removeprefix("model."): list(m.size)
        for k, m in meta.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    diff = next(((k, theirs.get(k), s) for k, s in ours.items() if theirs.get(k) != s), None)
    diff = diff or next(((k, s, None) for k, s in theirs.items() if k not in ours), None)
    if diff is None:
        return
    name, saved_shape, our_shape = diff
    m = cfg.model
    fix = _model_fix(
        marker.get("model"), marker.get("tokenizer"), identity.get("tokenizer"), m, args, initial
    )
    raise UserError(
        f"checkpoint {path} belongs to another model: parameter {name} is {saved_shape or 'absent'} there"
        f" and {our_shape or 'absent'} in this run's model ({m.name} {m.flavor}, {_describe_args(args)});"
        f" the checkpoint's model: {_describe_model(marker.get('model'))}; {fix}"
    )


def _describe_args(a) -> str:
    a = a if isinstance(a, dict) else dataclasses.asdict(a)
    return (
        f"dim {a['dim']}, {a['n_layers']} layers, {a['n_heads']} heads, {a['n_kv_heads']} kv heads,"
        f" vocab {a['vocab_size']}" + (", tied embeddings" if a.get("tie_embeddings") else "")
    )


_SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden_dim", "tie_embeddings")


def _shape(args) -> dict:
    """The fields of (recorded) ModelArgs that decide parameter shapes."""
    from torchtitan.models.llama3 import ModelArgs

    if isinstance(args, dict):
        fields = {f.name for f in dataclasses.fields(ModelArgs)}
        args = ModelArgs(**{k: v for k, v in args.items() if k in fields})
    return {k: getattr(args, k) for k in _SHAPE_FIELDS}


def _model_fix(
    saved: dict | None, saved_tok: dict | None, now_tok: dict | None, cfg_model, args, initial
) -> str:
    """What to change so that this run loads the checkpoint, from the model and tokenizer in its marker."""
    from torchtitan.models import MODELS

    elsewhere = (
        "or point checkpoint.initial_load_path at a checkpoint of this model"
        if initial
        else "or train this model in another job.dump_folder (or checkpoint.folder)"
    )
    if not saved or "args" not in saved:
        return f"use the model it was written for, {elsewhere}"
    sa, ours = _shape(saved["args"]), _shape(args)
    name = saved.get("name") or cfg_model.name
    flavors = MODELS[name][1] if name in MODELS else {}
    same = [k for k in _SHAPE_FIELDS if k != "vocab_size"]
    flavor = saved.get("flavor") or next(
        (f for f, a in flavors.items() if all(_shape(a)[k] == sa[k] for k in same)), None
    )
    flags = [f"--model.name={name}"] if name != cfg_model.name else []
    new_flavor = flavor in flavors and flavor != cfg_model.flavor
    if new_flavor:
        flags.append(f"--model.flavor={flavor}")
    # the vocabulary the run would have after that flag: its own override, else the flavor's
    vocab_then = cfg_model.vocab_size or (flavors[flavor].vocab_size if new_flavor else args.vocab_size)
    if sa["vocab_size"] != vocab_then:
        flags.append(f"--model.vocab_size={sa['vocab_size']}")
    if saved_tok and now_tok and saved_tok["path"] != now_tok["path"]:
        flags.append(f"--model.tokenizer_path={saved_tok['path']}")
    elif flags and sa["vocab_size"] != args.vocab_size:
        flags.append("and its tokenizer")
    if flags:
        verb = "load" if initial else "resume from"
        return f"to {verb} it set {' '.join(flags)}, {elsewhere}"
    diffs = [f"{k} {sa[k]} vs {ours[k]}" for k in _SHAPE_FIELDS if sa[k] != ours[k]]
    if diffs:
        return f"no flavor has its shape ({', '.join(diffs)}: checkpoint vs this run); {elsewhere[3:]}"
    return f"the model definition changed since it was written (same config, other shapes): restore it, {elsewhere}"


def _describe_model(saved: dict | None) -> str:
    if not saved or "args" not in saved:
        return "not recorded (written by another tool or an older version)"
    name = " ".join(str(saved[k]) for k in ("name", "flavor") if saved.get(k))
    return f"{name} ({_describe_args(saved['args'])})" if name else _describe_args(saved["args"])
