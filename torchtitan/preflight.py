"""Check a launch without starting it: no GPU, no process group, no training.

    python -m torchtitan.preflight [--world_size N] [--nnodes N] [--rdzv_endpoint HOST:PORT] \\
        --job.config_file train_configs/llama3_8b.toml [--section.key=value ...]
    python train.py --job.dry_run=true ...      # the same checks from the trainer's entry point

Checks, each one line of the report: the config (strict), the mesh and every divisibility rule for the world
size (--world_size, else WORLD_SIZE from a launcher, else 1), the node count, tokenizer against the model's
vocabulary, the dataset (opened, one document read), the dump and checkpoint folders (writable), the head node
(resolvable, rendezvous port free when the head is this machine; from --rdzv_endpoint or MASTER_ADDR/MASTER_PORT),
and a rough per-device memory estimate (information only, never a failure).
Exit code 0 when every check passes, 2 otherwise ("error: ..." names the first failure on stderr).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile

from torchtitan.config import help_text, parse_args, validate
from torchtitan.errors import UserError

_LAUNCH_FLAGS = ("--world_size", "--nnodes", "--rdzv_endpoint")


def _split_launch_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Pull --world_size/--nnodes/--rdzv_endpoint (as --k=v or --k v) out of argv; the rest is config."""
    flags, rest, i = {}, [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in _LAUNCH_FLAGS:
            if "=" in argv[i]:
                flags[name[2:]] = argv[i].split("=", 1)[1]
            else:
                flags[name[2:]] = argv[i + 1] if i + 1 < len(argv) else ""
                i += 1
        else:
            rest.append(argv[i])
        i += 1
    return flags, rest


def _positive(name: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"preflight: --{name} must be a positive integer, got {value!r}")
    return int(value)


# ---- the checks: each returns a short "ok" detail or raises UserError --------------------------------------


def check_mesh(cfg, world_size: int) -> str:
    from torchtitan.models import model_args_from_config
    from torchtitan.parallel.dims import ParallelDims
    from torchtitan.parallel.pipeline import plan_pipeline

    dims = ParallelDims.from_config(cfg.parallelism, world_size)
    model_args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims.validate(model_args, cfg)  # heads, vocab, seq_len, batch
    if cfg.validation.enable:  # each dp rank's share of a validation batch: whole micro-batches
        from torchtitan.evaluate import validation_global_batch

        validation_global_batch(cfg, dims)
    if dims.pp_enabled:  # stages, schedule, micro-batches: the same checks the trainer runs
        plan_pipeline(
            cfg.parallelism, model_args.n_layers, cfg.training.local_batch_size, model_args.tie_embeddings
        )
    return dims.describe()


def check_nodes(cfg, world_size: int, nnodes: int | None) -> str:
    expected = cfg.job.expected_nodes
    if nnodes is None:
        return f"job.expected_nodes = {expected}; node count not given" if expected else "not given"
    if expected is not None and expected != nnodes:
        raise UserError(f"job.expected_nodes is {expected} but the launch has {nnodes} node(s) (--nnodes)")
    if world_size % nnodes:
        raise UserError(
            f"world size {world_size} is not divisible by {nnodes} nodes; every node runs the same number of processes"
        )
    return f"{nnodes} node(s) x {world_size // nnodes} process(es)"


def check_tokenizer(cfg) -> str:
    from torchtitan.data import build_tokenizer, check_vocab
    from torchtitan.models import model_args_from_config

    model_args = model_args_from_config(cfg.model, cfg.training.seq_len)
    tokenizer = build_tokenizer(cfg.model.tokenizer_path)
    check_vocab(tokenizer, model_args.vocab_size, cfg.model.tokenizer_path)
    return f"{cfg.model.tokenizer_path}: {tokenizer.vocab_size} tokens = model vocab_size"


def check_dataset(cfg) -> str:
    from torchtitan.data.dataset import _open_source

    d = cfg.data
    where = f"data.dataset_path {d.dataset_path}" if d.dataset_path else f"data.dataset {d.dataset}"
    try:
        ds, where = _open_source(d.dataset, d.dataset_path, "train")
        for i, row in enumerate(ds):
            if d.text_field not in row:
                raise UserError(
                    f"data.text_field '{d.text_field}' is not a column of {where}; columns are {', '.join(row)}"
                )
            if isinstance(row[d.text_field], str) and row[d.text_field]:
                return f"{where}: first document has {len(row[d.text_field]):,} characters"
            if i >= 1000:
                break
    except UserError:
        raise
    except Exception as e:  # network, permissions, corrupt files: whatever the source raises, one line
        raise UserError(
            f"{where} could not be read: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        ) from None
    raise UserError(f"{where} has no non-empty '{d.text_field}' document in its first rows")


def _check_writable(folder: str, key: str) -> str:
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".preflight"):
            pass
    except OSError as e:
        raise UserError(f"{key} {folder} is not writable: {e.strerror}") from None
    return f"{folder} writable"


def check_folders(cfg) -> str:
    out = _check_writable(cfg.job.dump_folder, "job.dump_folder")
    if cfg.checkpoint.enable:
        folder = os.path.join(cfg.job.dump_folder, cfg.checkpoint.folder)
        out += "; checkpoint " + _check_writable(folder, "checkpoint.folder")
    return out


def check_rendezvous(endpoint: str | None) -> str:
    if not endpoint:
        return "not checked (no --rdzv_endpoint or MASTER_ADDR/MASTER_PORT)"
    host, _, port_text = endpoint.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UserError(f"rendezvous endpoint {endpoint!r} is not HOST:PORT with a port in 1..65535")
    port = int(port_text)
    try:
        addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UserError(
            f"rendezvous host {host!r} does not resolve ({e.strerror}); use the head node's name or IP"
        ) from None
    ip = addr[4][0]
    # Binding the address tells both things at once: EADDRNOTAVAIL = the head is another machine (the port
    # cannot be checked from here), EADDRINUSE = something already listens where torchrun's store must.
    with socket.socket(addr[0], socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(
                    f"rendezvous port {port} on {host} ({ip}) is already in use; pick a free port (--rdzv_endpoint/MASTER_PORT)"
                ) from None
            if e.errno == errno.EADDRNOTAVAIL:
                return f"{host} -> {ip} (another machine: port {port} not checked)"
            raise UserError(f"rendezvous {host}:{port} ({ip}): cannot bind: {e.strerror}") from None
    return f"{host} -> {ip}, port {port} free"


def estimate_memory(cfg, world_size: int) -> str:
    """A rough per-device figure: fp32 master weights + grads + AdamW moments (16 B/param) sharded over the
    whole world, plus activations saved for backward. Not counted: allocator fragmentation, communication
    buffers, FSDP's gathered layers, the CUDA context (~0.5-1 GiB): treat the result as a lower bound."""
    from torchtitan.models import model_args_from_config
    from torchtitan.parallel.dims import ParallelDims

    a = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims = ParallelDims.from_config(cfg.parallelism, world_size)
    t = cfg.training
    states = (
        16 * a.num_params() / world_size
    )  # every layout shards the states over all ranks (FSDP x TP x PP)
    act_bytes = 2 if t.mixed_precision_param == "bfloat16" else 4
    tokens = t.local_batch_size * t.seq_len / (dims.cp * dims.tp)  # sequence parallel / CP split the tokens
    kv_dim = a.n_kv_heads * a.head_dim
    # Tensors a Llama block keeps for backward, per token: norms' inputs/outputs, q/k/v, attention output,
    # the FFN's w1/w3 outputs, their SiLU and product (counted from the block's forward).
    per_layer = (6 * a.dim + 2 * kv_dim + 4 * a.ffn_hidden_dim) * act_bytes
    layers = a.n_layers / dims.pp
    if cfg.activation_checkpoint.mode == "full":
        acts = tokens * (layers * a.dim * act_bytes + per_layer)  # block inputs + one block recomputed
    else:
        acts = tokens * layers * per_layer
    logits = tokens * a.vocab_size * (act_bytes + 8)  # logits, fp32 copy for the loss, fp32 gradient
    total = states + acts + logits
    gib = 2.0**30
    line = (
        f"~{total / gib:.2f} GiB per device (weights+grads+AdamW {states / gib:.2f}, activations "
        f"{acts / gib:.2f}, logits {logits / gib:.2f}; rough lower bound)"
    )
    try:
        import torch

        if torch.cuda.is_available():
            cap = torch.cuda.get_device_properties(0).total_memory
            line += f"; device has {cap / gib:.1f} GiB" + (" -- LIKELY OOM" if total > 0.9 * cap else "")
    except Exception:
        pass
    return line


def run_checks(cfg, world_size: int, nnodes: int | None = None, endpoint: str | None = None, out=None) -> int:
    """Run every check, print one line per check, return the exit code (0 all ok, 2 something failed)."""
    out = out or sys.stdout
    checks = [
        ("mesh", lambda: check_mesh(cfg, world_size)),
        ("nodes", lambda: check_nodes(cfg, world_size, nnodes)),
        ("tokenizer", lambda: check_tokenizer(cfg)),
        ("dataset", lambda: check_dataset(cfg)),
        ("folders", lambda: check_folders(cfg)),
        ("rendezvous", lambda: check_rendezvous(endpoint)),
    ]
    failures = []
    for name, fn in checks:
        try:
            print(f"preflight: {name:<10} ok    {fn()}", file=out, flush=True)
        except UserError as e:
            failures.append(str(e))
            print(f"preflight: {name:<10} FAIL  {e}", file=out, flush=True)
    if not failures:  # the estimate needs a valid mesh and model, so only when everything else passed
        print(f"preflight: {'memory':<10} info  {estimate_memory(cfg, world_size)}", file=out, flush=True)
        print(
            f"preflight ok: {cfg.model.name} {cfg.model.flavor}, world size {world_size}",
            file=out,
            flush=True,
        )
        return 0
    more = f" (and {len(failures) - 1} more above)" if len(failures) > 1 else ""
    print(f"error: {failures[0]}{more}", file=sys.stderr, flush=True)
    return UserError.exit_code


def preflight(argv: list[str]) -> int:
    flags, argv = _split_launch_flags(argv)
    world_size = _positive("world_size", flags["world_size"]) if "world_size" in flags else None
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
    nnodes = _positive("nnodes", flags["nnodes"]) if "nnodes" in flags else None
    endpoint = flags.get("rdzv_endpoint")
    if endpoint is None and os.environ.get("MASTER_ADDR") and "TORCHELASTIC_RUN_ID" not in os.environ:
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}"
    cfg = parse_args(argv)
    validate(cfg)
    return run_checks(cfg, world_size, nnodes, endpoint)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        print(help_text())
        return 0
    try:
        return preflight(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
