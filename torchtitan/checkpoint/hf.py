"""Hugging Face Llama 3 checkpoints (safetensors + config.json) <-> our DCP checkpoints.

Names (HF -> ours):
    model.embed_tokens.weight                        tok_embeddings.weight
    model.layers.i.self_attn.{q,k,v,o}_proj.weight   layers.i.attention.{wq,wk,wv,wo}.weight
    model.layers.i.mlp.{gate,down,up}_proj.weight    layers.i.feed_forward.{w1,w2,w3}.weight
    model.layers.i.{input,post_attention}_layernorm  layers.i.{attention,ffn}_norm.weight
    model.norm.weight, lm_head.weight                norm.weight, output.weight (absent when tied)

RoPE: our model (Meta's layout) rotates interleaved pairs (x[2j], x[2j+1]) of each head; HF's rotates
(x[j], x[j + head_dim/2]) ("rotate_half"). Both compute the same attention if the rows of wq and wk inside each
head are reordered: Meta row 2j+c (c = 0, 1) is HF row c*head_dim/2 + j. `_meta_to_hf_rows` applies it,
`_hf_to_meta_rows` undoes it. wv, wo and everything else are identical.

A converted DCP folder holds {"model": {name: tensor}} (the same keys a training checkpoint has under "model"),
plus COMMITTED.json (kind "export", the model's shape, every file's size and checksum) and the HF config.json, so
`checkpoint.initial_load_path` can point at it. A HF folder we write carries the same COMMITTED.json (kind "hf")
beside its safetensors; reading either checks the checksums first, so a damaged file is one line naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from torchtitan.checkpoint.checksums import ChecksumWriter, bytes_checksum
from torchtitan.checkpoint.integrity import MARKER, verify_checkpoint, write_marker
from torchtitan.errors import UserError
from torchtitan.models.llama3.args import ModelArgs, RopeScaling

_LAYER = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
_TOP = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")
_OUR_LAYER = re.compile(r"layers\.(\d+)\.(.+)\.weight")


def _meta_to_hf_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _hf_to_meta_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


# ------------------------------------------------------------------------------------------------------ config


_HF_LLAMA_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "vocab_size",
)


def model_args_from_hf_config(cfg: dict, where: str = "config.json") -> ModelArgs:
    """ModelArgs for a HF LlamaConfig dict (read from `where`, for error messages); the FFN width is reproduced
    exactly whatever rounding made it. Anything but a Llama config is refused."""
    if cfg.get("model_type") != "llama":
        raise UserError(
            f"{where} has model_type {cfg.get('model_type')!r}: not a Hugging Face Llama checkpoint; valid:"
            " 'llama' (LlamaForCausalLM)"
        )
    missing = [k for k in _HF_LLAMA_KEYS if k not in cfg]
    if missing:
        raise UserError(f"{where} lacks {', '.join(missing)}: not a complete Hugging Face Llama config")
    dim, inter = cfg["hidden_size"], cfg["intermediate_size"]
    n_heads = cfg["num_attention_heads"]
    if cfg.get("head_dim", dim // n_heads) != dim // n_heads:
        raise UserError(
            f"{where} head_dim={cfg['head_dim']} != hidden_size/num_attention_heads: not supported"
        )
    biased = [k for k in ("attention_bias", "mlp_bias") if cfg.get(k)]
    if biased:
        raise UserError(
            f"{where} sets {' and '.join(f'{k} = true' for k in biased)}: this Llama's projections have no biases;"
            " valid: false (Meta's Llama 2 and 3 checkpoints)"
        )
    base = int(
        8 * dim / 3
    )  # ModelArgs.ffn_hidden_dim rounds int(mult * base) up to a multiple of multiple_of
    # Published Llama 3.x configs use rope_theta + rope_scaling; transformers >= 5 writes rope_parameters.
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    kind = (
        scaling.get("rope_type", scaling.get("type")) if scaling else None
    )  # "type" before transformers 4.45
    if scaling and kind != "llama3":
        raise UserError(
            f"{where} rope_scaling type {kind!r} is not supported; valid: llama3 (Llama 3.1 and later)"
        )
    args = ModelArgs(
        dim=dim,
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads", n_heads),
        vocab_size=cfg["vocab_size"],
        multiple_of=inter,
        ffn_dim_multiplier=None if base <= inter else inter / base,
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        rope_scaling=None
        if not scaling
        else RopeScaling(
            factor=scaling["factor"],
            low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_position_embeddings=scaling["original_max_position_embeddings"],
        ),
        max_seq_len=cfg.get("max_position_embeddings", 8192),
        tie_embeddings=cfg.get("tie_word_embeddings", False),
    )
    assert args.ffn_hidden_dim == inter, (args.ffn_hidden_dim, inter)
    return args


def hf_config_from_model_args(args: ModelArgs, dtype: str = "float32") -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "rope_scaling": None,
    }
    if args.rope_scaling is not None:
        s = args.rope_scaling
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    return cfg


# ----------------------------------------------------------------------------------------------- state dicts


def hf_to_ours(sd: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in sd.items():
        if name in _TOP:
            if name == "lm_head.weight" and args.tie_embeddings:
                continue  # a tied head is the embedding; some exports still write the duplicate
            out[_TOP[name]] = w
            continue
        m = _HF_LAYER.fullmatch(name)
        if m is None or m.group(2) not in _LAYER:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer older exports saved; we recompute RoPE from config
            raise UserError(f"Hugging Face tensor {name!r} has no counterpart in our Llama 3 model")
        ours = _LAYER[m.group(2)]
        if ours == "attention.wq":
            w = _hf_to_meta_rows(w, args.n_heads)
        elif ours == "attention.wk":
            w = _hf_to_meta_rows(w, args.n_kv_heads)
        out[f"layers.{m.group(1)}.{ours}.weight"] = w
    return out


def ours_to_hf(sd: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    top = {v: k for k, v in _TOP.items()}
    layer = {v: k for k, v in _LAYER.items()}
    out = {}
    for name, w in sd.items():
        if name in top:
            out[top[name]] = w
            continue
        m = _OUR_LAYER.fullmatch(name)
        if m is None or m.group(2) not in layer:
            raise UserError(
                f"checkpoint tensor {name!r} has no counterpart in Hugging Face's LlamaForCausalLM"
            )
        if m.group(2) == "attention.wq":
            w = _meta_to_hf_rows(w, args.n_heads)
        elif m.group(2) == "attention.wk":
            w = _meta_to_hf_rows(w, args.n_kv_heads)
        out[f"model.layers.{m.group(1)}.{layer[m.group(2)]}.weight"] = w
    return out


# ------------------------------------------------------------------------------------------------------ files


def read_hf_checkpoint(hf_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, {name: tensor}) from a HF folder: config.json + model.safetensors or sharded with an index."""
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    if (hf_dir / MARKER).is_file():  # written by write_hf_checkpoint: sizes and checksums first
        verify_checkpoint(str(hf_dir), checksums=True)
    cfg_path = hf_dir / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{cfg_path} does not exist; a Hugging Face checkpoint folder needs config.json")
    cfg = json.loads(cfg_path.read_text())
    index = hf_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    sd = {}
    for f in files:
        if not (hf_dir / f).is_file():
            raise UserError(f"safetensors file {hf_dir / f} is missing")
        try:
            sd.update(load_file(hf_dir / f))
        except Exception as e:
            raise UserError(
                f"safetensors file {hf_dir / f} is unreadable ({type(e).__name__}: {e})"[:500]
            ) from None
    return cfg, sd


def write_hf_checkpoint(
    out_dir: str | os.PathLike, cfg: dict, sd: dict[str, torch.Tensor], max_shard_bytes: int = 5 * 2**30
) -> None:
    """config.json + safetensors, split into shards of at most max_shard_bytes with an index when > 1 shard, and
    COMMITTED.json with every file's checksum (each shard is serialized in memory, hashed and written: one
    shard's worth of extra memory, no read-back)."""
    from safetensors.torch import save

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, cur, size = [], {}, 0
    for name, w in sd.items():
        nbytes = w.numel() * w.element_size()
        if cur and size + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name], size = w.contiguous(), size + nbytes
    shards.append(cur)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    checksums, weight_map = {}, {}
    for i, shard in enumerate(shards):
        fname = (
            "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        data = save(shard, metadata={"format": "pt"})
        (out_dir / fname).write_bytes(data)
        checksums[fname] = (len(data), bytes_checksum(data))
        weight_map.update({name: fname for name in shard})
        del data
    if len(shards) > 1:
        total = sum(w.numel() * w.element_size() for w in sd.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    write_marker(str(out_dir), {"kind": "hf", "step": 0}, checksums)


def hf_to_dcp(
    hf_dir: str | os.PathLike, out_dir: str | os.PathLike, dtype: torch.dtype | None = None
) -> ModelArgs:
    """Convert a HF Llama 3 folder into a DCP model checkpoint (one process, no process group needed)."""
    cfg, sd = read_hf_checkpoint(hf_dir)
    args = model_args_from_hf_config(cfg, str(Path(hf_dir) / "config.json"))
    ours = {k: v.to(dtype) if dtype is not None else v for k, v in hf_to_ours(sd, args).items()}
    writer = ChecksumWriter(str(out_dir))
    dcp.save({"model": ours}, storage_writer=writer, no_dist=True)
    (Path(out_dir) / "config.json").write_text(json.dumps(cfg, indent=2))
    model = {"name": "llama3", "flavor": None, "args": dataclasses.asdict(args)}
    write_marker(
        str(out_dir), {"kind": "export", "step": 0, "source": str(hf_dir), "model": model}, writer.checksums
    )
    return args


def load_dcp_model(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint (training checkpoint, export or converted), full, on CPU."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    verify_checkpoint(str(path), checksums=True)
    reader = dcp.FileSystemReader(str(path))
    meta = reader.read_metadata()
    sd = {
        k[len("model.") :]: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    if not sd:
        raise UserError(f"checkpoint {path} holds no model tensors")
    state = {"model": sd}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state["model"]


def dcp_to_hf(
    dcp_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    args: ModelArgs,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Write a DCP checkpoint's model as a HF Llama folder (config.json + sharded safetensors)."""
    sd = load_dcp_model(dcp_dir)
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    dtype_name = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    write_hf_checkpoint(
        out_dir, hf_config_from_model_args(args, dtype_name), ours_to_hf(sd, args), max_shard_bytes
    )
