"""What a checkpoint keeps besides the tensors: `train_state/rank-<r>.json`, one plain JSON file per global rank.

It holds the step, tokens seen, the LR schedule, the optimizer's hyper-parameters, the data loader's position and
the RNG states (base64), so nothing is ever unpickled on load. The optimizer's tensors go to DCP with the model.
On load, the data loader's position is mapped to the new layout where that is exact (docs/checkpointing.md,
"Resharding").
"""

from __future__ import annotations

import base64
import os

import torch

from torchtitan.checkpoint.integrity import read_json
from torchtitan.log import logger

STATE_DIR = "train_state"


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def _jsonable(obj):
    """Tuples -> lists, tensors -> numbers: what the optimizer and scheduler keep in their plain state."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.item()
    return obj


def train_state(m, step: int, tokens_seen: int) -> dict:
    """This rank's train state, from CheckpointManager `m` (its optimizer, scheduler, data loader, extra state)."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in m.optimizer.state_dict()["param_groups"]]
    sched = {k: v for k, v in m.scheduler.state_dict().items() if k != "lr_lambdas"}
    return {
        "step": step,
        "tokens_seen": tokens_seen,
        "world_size": m.world_size,
        "dp_rank": m.dp_rank,
        "dp_degree": m.dp,
        "lr_scheduler": _jsonable(sched),
        "param_groups": _jsonable(groups),
        "dataloader": m.dataloader.state_dict() if m.dataloader is not None else None,
        "rng": {
            "cpu": _b64(torch.get_rng_state()),
            "cuda": _b64(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None,
        },
        **{key: obj.state_dict() for key, obj in m.extra_state.items()},
    }


def read_train_state(path: str, rank: int) -> dict:
    own = os.path.join(path, STATE_DIR, f"rank-{rank}.json")
    if os.path.exists(own):
        return read_json(own)
    return read_json(os.path.join(path, STATE_DIR, "rank-0.json"))  # fewer ranks saved than load now


def restore_rng(ts: dict, world_size: int) -> None:
    """The saved RNG states, when the run has as many ranks as the one that saved them."""
    if ts["world_size"] == world_size:
        torch.set_rng_state(_unb64(ts["rng"]["cpu"]))
        if ts["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(_unb64(ts["rng"]["cuda"]))


def restore_data(m, path: str, mine: dict) -> None:
    """Data-loader position across layouts (docs/checkpointing.md, "Resharding"), for CheckpointManager `m`.

    Same dp degree: each dp rank takes the state its dp rank saved (exact). Virtual shards (a state
    {"num_shards": K, "shards": {...}}) with unchanged K: the union of all ranks' shards, from which the new
    dp rank takes its own (exact for any dp degree). Otherwise every rank restarts its stream (replay).
    """
    if m.dataloader is None:
        return
    states = [
        read_json(os.path.join(path, STATE_DIR, f))
        for f in sorted(os.listdir(os.path.join(path, STATE_DIR)))
        if f.endswith(".json")
    ]
    current = m.dataloader.state_dict()
    saved = [s["dataloader"] for s in states if s.get("dataloader") is not None]
    if "shards" in current and saved and all(s.get("num_shards") == current["num_shards"] for s in saved):
        merged = {"num_shards": current["num_shards"], "shards": {}}
        for s in saved:
            merged["shards"].update(s["shards"])
        m.dataloader.load_state_dict(merged)
        return
    if mine["dp_degree"] == m.dp:
        same = next((s for s in states if s["dp_rank"] == m.dp_rank), None)
        if same is not None and same.get("dataloader") is not None:
            m.dataloader.load_state_dict(same["dataloader"])
            return
    if m.rank == 0:
        logger.warning(
            f"data loader state in {path} was saved with {mine['dp_degree']} data-parallel ranks and cannot be"
            f" mapped to {m.dp}: every rank restarts its data stream from the beginning (data is replayed);"
            " set data.num_shards to resume exactly across dp degrees"
        )
