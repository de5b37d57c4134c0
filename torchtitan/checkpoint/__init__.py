"""Checkpoints that lose nothing: what is saved, when, where, atomically; resume; exports; HF conversion.

Layout (docs/checkpointing.md):

    <job.dump_folder>/<checkpoint.folder>/
        step-200/                      a committed checkpoint (only names `step-<N>` with a marker are read)
            .metadata, __<r>_0.distcp  DCP: model weights and optimizer state, sharded, any layout can read them
            train_state/rank-<r>.json  per global rank: step, tokens seen, LR schedule, optimizer hyper-parameters,
                                       data-loader position, RNG states (plain JSON: nothing is unpickled)
            COMMITTED.json             written last: kind (full | seed | export), step, model and tokenizer it
                                       belongs to, every file with its size and content checksum
        step-300.tmp-<id>/             a save in progress or a crashed one: never read, deleted by a later save

A save writes into `step-N.tmp-<id>`; when every rank's data is on disk, rank 0 writes COMMITTED.json and renames
the folder to `step-N` (rename is atomic on POSIX). A process killed at any moment therefore leaves either the old
set of checkpoints or the old set plus the new one, never a half-written `step-N`.

Nothing lost, nothing silent: a save that fails (full disk, I/O error, read-only folder; sync or async) stops the
run on every rank with one line (what failed, free space, the last good checkpoint), exit code 2, after removing
its partial folder; older checkpoints are never touched. A load first checks the marker: sizes, checksums
(checkpoint.verify_on_load, shared out over the ranks), the tokenizer and every parameter's shape against the
model being built, so a corrupt file, a replaced tokenizer or another model's checkpoint is one line, not a
traceback from DCP or silently wrong weights.

One module per concern (each re-exported here):
    manager      CheckpointManager: what is saved, when, where; save (sync or async), commit, load, close
    integrity    the marker (COMMITTED.json), committed checkpoints, size and checksum checks before a load
    checksums    ChecksumWriter: DCP's writer hashing every file as it is written
    staging      the async stager (allocated once per run) and the record of a save in flight
    failures     a failed save as the one line every rank raises
    folder       which checkpoint a run loads, which it keeps (keep_latest_k), whether they fit on the disk
    train_state  the per-rank JSON: step, schedule, data position, RNG
    compat       does a checkpoint belong to this model and tokenizer, and what to change if not
    hf           Hugging Face Llama folders (safetensors + config.json) <-> our DCP checkpoints
The preemption flag and NonFiniteError live with the loop's checks (torchtitan/host_sync.py).
"""

from torchtitan.checkpoint.checksums import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    ChecksumWriter,
    bytes_checksum,
    file_checksum,
)
from torchtitan.checkpoint.compat import check_compatible, check_resume_target, run_identity
from torchtitan.checkpoint.folder import checkpoint_to_load, space_warning
from torchtitan.checkpoint.hf import (
    dcp_to_hf,
    hf_config_from_model_args,
    hf_to_dcp,
    hf_to_ours,
    load_dcp_model,
    model_args_from_hf_config,
    ours_to_hf,
    read_hf_checkpoint,
    write_hf_checkpoint,
)
from torchtitan.checkpoint.integrity import (
    MARKER,
    checksum_mismatch,
    committed_checkpoints,
    verify_checkpoint,
    write_marker,
)
from torchtitan.checkpoint.manager import CheckpointManager
from torchtitan.checkpoint.staging import build_stager, stager_for_save, stager_survives_reuse
from torchtitan.checkpoint.train_state import STATE_DIR

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "MARKER",
    "STATE_DIR",
    "CheckpointManager",
    "ChecksumWriter",
    "build_stager",
    "bytes_checksum",
    "check_compatible",
    "check_resume_target",
    "checkpoint_to_load",
    "checksum_mismatch",
    "committed_checkpoints",
    "dcp_to_hf",
    "file_checksum",
    "hf_config_from_model_args",
    "hf_to_dcp",
    "hf_to_ours",
    "load_dcp_model",
    "model_args_from_hf_config",
    "ours_to_hf",
    "read_hf_checkpoint",
    "run_identity",
    "space_warning",
    "stager_for_save",
    "stager_survives_reuse",
    "verify_checkpoint",
    "write_hf_checkpoint",
    "write_marker",
]
