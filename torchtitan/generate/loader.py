"""A model ready for generation: weights from a checkpoint, a dtype, optional weight-only quantization, on one
device or tensor parallel over the processes of a torchrun launch.

Checkpoints (`--checkpoint PATH`):
  * a DCP step folder of ours: a full training checkpoint (the optimizer state is not read), a model-only export,
    a seed checkpoint, or a Hugging Face model converted by scripts/convert_hf_to_dcp.py (its config.json gives
    the shape); any other DCP folder with a `.metadata` file;
  * a checkpoint folder (`<dump_folder>/checkpoint`): its newest committed step;
  * a Hugging Face Llama folder (config.json + safetensors), converted in memory (torchtitan/checkpoint/hf.py).
Without a config.json the shape is the job config's [model] section (flavor, vocab_size, max_seq_len), as in
training.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from torchtitan.checkpoint import MARKER, committed_checkpoints, verify_checkpoint
from torchtitan.checkpoint.hf import hf_to_ours, load_dcp_model, model_args_from_hf_config, read_hf_checkpoint
from torchtitan.config import JobConfig
from torchtitan.errors import UserError
from torchtitan.log import logger
from torchtitan.models import model_args_from_config
from torchtitan.models.llama3 import ModelArgs, Transformer, normalize_fqn
from torchtitan.models.llama3.model import precompute_freqs_cis

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
QUANTIZE = ("int8", "int4")


@dataclass
class LoadedModel:
    model: Transformer
    args: ModelArgs
    device: torch.device
    source: str  # what was loaded, for the log and the benchmark JSON
    rank: int = 0
    world_size: int = 1  # > 1: tensor parallel over this many processes
    broadcast: Callable[[torch.Tensor], None] | None = None  # rank 0's sampled tokens -> every rank


def find_checkpoint(path: str) -> tuple[str, Path]:
    """("dcp" | "hf", folder) for --checkpoint PATH; a checkpoint folder resolves to its newest committed step."""
    p = Path(path)
    if not p.is_dir():
        # the checkpoint folder of a run's dump folder (config.toml is written by every run) that saved none
        if not p.exists() and (p.parent / "config.toml").is_file():
            raise UserError(
                f"--checkpoint {path} does not exist: the run in {p.parent} saved no checkpoint (checkpointing is"
                " off unless the run had --checkpoint.enable=true)"
            )
        raise UserError(f"--checkpoint {path} does not exist or is not a folder")
    if (p / MARKER).is_file() or (p / ".metadata").is_file():
        return "dcp", p
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return "hf", p
    steps = committed_checkpoints(str(p))
    if steps:
        return "dcp", Path(steps[max(steps)])
    raise UserError(
        f"--checkpoint {path} is not a checkpoint: expected a DCP step folder ({MARKER} or .metadata), a checkpoint"
        " folder with committed step-N folders, or a Hugging Face folder (config.json + *.safetensors)"
    )


def checkpoint_model_args(cfg: JobConfig, folder: Path) -> ModelArgs:
    """The model shape of a checkpoint found by find_checkpoint: its config.json (a Hugging Face folder, or our
    conversion of one, which keeps it), else the job config's [model] section."""
    hf_config = folder / "config.json"
    if hf_config.is_file():
        import json

        args = model_args_from_hf_config(json.loads(hf_config.read_text()), str(hf_config))
        if cfg.model.max_seq_len is not None:
            args.max_seq_len = cfg.model.max_seq_len
        return args
    return model_args_from_config(cfg.model, cfg.training.seq_len)


def _check_names_and_shapes(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str, flavor: str):
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    extra = sorted(set(sd) - set(expected))
    wrong = [k for k in expected if k in sd and tuple(sd[k].shape) != expected[k]]
    if missing or extra or wrong:
        what = (
            f"tensor {wrong[0]} has shape {list(sd[wrong[0]].shape)}, the model's is {list(expected[wrong[0]])}"
            if wrong
            else f"missing {missing[:3]}"
            if missing
            else f"unexpected {extra[:3]}"
        )
        raise UserError(
            f"checkpoint {source} does not fit the model (model.flavor={flavor!r}, or the checkpoint's"
            f" config.json): {what}; pick the flavor/vocab_size the checkpoint was trained with"
        )


def read_full_state_dict(kind: str, folder: Path, args: ModelArgs) -> dict[str, torch.Tensor]:
    """Every model tensor of the checkpoint, full (unsharded), on CPU, under our names."""
    if kind == "hf":
        _, sd = read_hf_checkpoint(folder)
        return hf_to_ours(sd, args)
    try:
        with warnings.catch_warnings():  # DCP's notice that it reads in one process: that is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            return load_dcp_model(folder)
    except UserError:
        raise
    except Exception as e:  # DCP raises a variety of errors for unreadable folders
        raise UserError(
            f"cannot read checkpoint {folder}: {type(e).__name__}: {str(e).strip()[:300]}"
        ) from None


def check_quantize(mode: str | None, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a quantization this device/dtype cannot run, before any weight is read."""
    if mode is None:
        return
    if mode not in QUANTIZE:
        raise UserError(f"--quantize {mode!r} is invalid; valid: {', '.join(QUANTIZE)}")
    try:
        import torchao
    except ImportError as e:
        raise UserError(f"--quantize {mode} needs torchao, which cannot be imported here ({e})") from None
    if mode == "int4" and device.type != "cuda":
        raise UserError(
            f"--quantize int4 is not available on {device.type}: torchao {torchao.__version__} has int4 weight-only"
            " kernels only for CUDA GPUs; use --quantize int8 here, or int4 on a CUDA GPU"
        )
    if mode == "int4" and dtype != torch.bfloat16:
        raise UserError("--quantize int4 needs --dtype bfloat16 (torchao's int4 kernel computes in bf16)")


def quantize_weights(model: torch.nn.Module, mode: str | None) -> None:
    """torchao weight-only quantization of every nn.Linear (the projections and an untied output head; a tied
    head multiplies by the embedding table, which stays in the model's dtype). check_quantize first.

    int8: one int8 per weight, one scale per output row (Int8WeightOnlyConfig); activations stay bf16/fp32.
    int4: groups of 128 weights share a scale and zero point (Int4WeightOnlyConfig, tinygemm's tile-packed
    layout, CUDA only).
    """
    if mode is None:
        return
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    if mode == "int8":
        quantize_(model, Int8WeightOnlyConfig())
    else:
        quantize_(model, Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"))


def load_model(
    cfg: JobConfig, checkpoint: str, device: torch.device, dtype: torch.dtype, quantize: str | None = None
) -> LoadedModel:
    """Build the model, load `checkpoint` into it in `dtype` on `device`, quantize; tensor parallel when the
    launcher started several processes (WORLD_SIZE > 1)."""
    check_quantize(quantize, device, dtype)
    kind, folder = find_checkpoint(checkpoint)
    if kind == "dcp":
        marker = verify_checkpoint(str(folder))
        source = f"{folder} ({marker.get('kind', 'dcp')} checkpoint, step {marker.get('step', 0)})"
    else:
        source = f"{folder} (Hugging Face)"
    args = checkpoint_model_args(cfg, folder)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        if quantize is not None:
            raise UserError(
                f"--quantize {quantize} with tensor parallel ({world} processes) is not supported; run one process"
                " or leave out --quantize"
            )
        return _load_tensor_parallel(cfg, kind, folder, source, args, device, dtype, world)

    model = model_from_state_dict(
        args, read_full_state_dict(kind, folder, args), device, dtype, str(folder), cfg.model.flavor
    )
    quantize_weights(model, quantize)
    # bf16 on a CPU without bf16 instructions: as in training, plus oneDNN's bf16 GEMV for decode's few rows;
    # quantized weights keep torchao's kernels (imported at use: the torchtitan.parallel package loads FSDP/TP)
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels

    use_cpu_bf16_kernels(model, device.type, dtype, cfg.training.cpu_bf16_fp32_kernels)
    return LoadedModel(model, args, device, source)


def model_from_state_dict(
    args: ModelArgs,
    sd: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    source: str = "state dict",
    flavor: str = "",
) -> Transformer:
    """An eval-mode model holding `sd`'s tensors (moved to device and dtype; nothing is initialized first)."""
    with torch.device("meta"):
        model = Transformer(args)
    _check_names_and_shapes(model, sd, source, flavor)
    model.load_state_dict({k: sd.pop(k).to(device=device, dtype=dtype) for k in list(sd)}, assign=True)
    model.freqs_cis = precompute_freqs_cis(args).to(device)  # not in the checkpoint; fp32 whatever the dtype
    return model.eval().requires_grad_(False)


def load_full_weights(
    model_parts: list[torch.nn.Module], sd: dict[str, torch.Tensor], args: ModelArgs, source: str, flavor: str
) -> None:
    """Copy a full state dict (read_full_state_dict) into an already parallelized, materialized model (its
    pipeline stages, if any): each rank keeps its slice of every parameter it holds (TP, FSDP), with no
    communication. Names and shapes are checked against the whole model first (one line if they do not fit).
    Each full tensor is dropped from `sd` once copied, so the full copy shrinks as the shards fill."""
    from torchtitan.parallel import fill_shard

    with torch.device("meta"):
        _check_names_and_shapes(Transformer(args), sd, source, flavor)
    with torch.no_grad():
        for part in model_parts:
            for name, param in part.named_parameters():  # wrappers (AC, compile) add infixes to the names
                fill_shard(param, sd.pop(normalize_fqn(name)))


def _load_tensor_parallel(cfg, kind, folder, source, args, device, dtype, world) -> LoadedModel:
    """Megatron-style TP without sequence parallel (the right plan for decoding one token per row):
    torchtitan/parallel/tensor.py's plan with a replicated residual stream and gathered logits."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from torchtitan.parallel import ParallelDims, init_distributed, materialize
    from torchtitan.parallel.tensor import apply_tp

    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=world, pp=1, world_size=world)
    check = copy.deepcopy(cfg)  # the training sections do not apply to generation; only the model checks
    check.parallelism.enable_sequence_parallel = False
    check.parallelism.fsdp_cpu_offload = False
    check.training.global_batch_size = -1
    dims.validate(args, check, device.type)
    rank, _ = init_distributed(device, cfg.comm.init_timeout_seconds)
    dims.build_mesh(device.type)

    with torch.device("meta"):
        model = Transformer(args)
    model.to(dtype)
    apply_tp(model, dims.mesh("tp"), sequence_parallel=False, loss_parallel=False)
    materialize(model, device)  # storage and the RoPE table
    if kind == "dcp":  # each rank reads its own shards (DCP reshards whatever layout saved them)
        state = {"model": get_model_state_dict(model)}
        try:
            dcp.load(state, checkpoint_id=str(folder))
        except Exception as e:
            msg = str(e).strip().splitlines()
            raise UserError(
                f"cannot load checkpoint {folder}: {type(e).__name__}: {msg[0] if msg else ''}"[:500]
            ) from None
        set_model_state_dict(model, state["model"])
    else:  # every rank reads the full Hugging Face tensors and keeps its slice
        load_full_weights(
            [model], read_full_state_dict(kind, folder, args), args, str(folder), cfg.model.flavor
        )
    model.eval().requires_grad_(False)
    logger.info(f"tensor parallel over {world} processes ({dims.describe()})")
    return LoadedModel(model, args, device, source, rank, world, broadcast=lambda t: dist.broadcast(t, src=0))
