"""Check a launch without starting it: no GPU, no process group, no training.

    python -m torchtitan.preflight [--world_size N] [--nnodes N] [--rdzv_endpoint HOST:PORT] \\
        --job.config_file train_configs/llama3_8b.toml [--section.key=value ...]
    python train.py --job.dry_run=true ...      # the same checks from the trainer's entry point

Checks, each one line of the report: the config (strict), the mesh and every divisibility rule for the world
size (--world_size, else comm.fake_world_size under comm.mode=fake_backend, else WORLD_SIZE from a launcher,
else 1), the node count, tokenizer against the model's vocabulary, the dataset and, with validation on, the
held-out one (each opened, one document read, errors naming its own keys: data.* or validation.*), every folder
the run writes (created and writable: dump folder, logs, tb, checkpoint and trace folders), the head node (resolvable, rendezvous port free when the head is
this machine; from --rdzv_endpoint or MASTER_ADDR/MASTER_PORT), and the estimator's per-device peak memory and this
node's GPUs as the estimator needs them -- power limit in force, NVLink mesh or switch, and the --estimate flags
that say so (information only, never a failure), plus a warning when the checkpoint folder's free space is below what
keep_latest_k + 1 checkpoints need.
Exit code 0 when every check passes, 2 otherwise ("error: ..." names the first failure on stderr).
"""

from __future__ import annotations

import errno
import os
import socket
import sys

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
            cfg.parallelism,
            model_args.n_layers,
            cfg.training.local_batch_size,
            model_args.tie_embeddings,
            cfg.activation_checkpoint,
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


def _check_source(dataset: str, dataset_path: str | None, split: str, text_field: str, key: str) -> str:
    """Open one data source, read until a non-empty document; errors name `key`'s config keys."""
    from torchtitan.data.dataset import _open_source, read_error

    where = f"{key}.dataset_path {dataset_path}" if dataset_path else f"{key}.dataset {dataset}"
    files = ds = None
    try:
        ds, files, where = _open_source(dataset, dataset_path, split, key)
        for i, row in enumerate(ds):
            if text_field not in row:
                raise UserError(
                    f"data.text_field '{text_field}' is not a column of {where}; columns are {', '.join(row)}"
                )
            if isinstance(row[text_field], str) and row[text_field]:
                return f"{where}: first document has {len(row[text_field]):,} characters"
            if i >= 1000:
                break
    except UserError:
        raise
    except Exception as e:  # network, permissions, corrupt files: whatever the source raises, one line
        raise read_error(e, where, files, ds) from None
    raise UserError(f"{where} has no non-empty '{text_field}' document in its first rows")


def check_dataset(cfg) -> str:
    d = cfg.data
    return _check_source(d.dataset, d.dataset_path, "train", d.text_field, "data")


def check_validation_data(cfg) -> str:
    """The held-out source, when validation is on: validation.dataset / dataset_path / split, named as such."""
    v = cfg.validation
    if not v.enable:
        return "validation off"
    from torchtitan.data.dataset import validation_source

    dataset, dataset_path, key = validation_source(cfg)
    where = _check_source(dataset, dataset_path, v.split, cfg.data.text_field, key)
    return f"split {v.split} of {where}"


def check_folders(cfg) -> str:
    from torchtitan.disk import check_output_paths

    return check_output_paths(cfg, keep=False)


def check_space(cfg) -> str | None:
    """A warning (never a failure) when the checkpoint folder has less free space than its checkpoints need."""
    from torchtitan.checkpoint import space_warning
    from torchtitan.models import model_args_from_config

    return space_warning(cfg, model_args_from_config(cfg.model, cfg.training.seq_len).num_params())


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
    """The estimator's peak memory per device (torchtitan/estimate, docs/estimate.md) for this world size on this
    machine's device: one memory model for the preflight and `python -m torchtitan.estimate`."""
    from torchtitan.estimate.training import estimate_memory as estimate

    try:
        m = estimate(cfg, world_size)
    except UserError as e:  # e.g. context parallel planned from a CPU-only machine
        return f"n/a ({e})"
    b = m["memory_breakdown_gib"]
    states = b["parameters"] + b["gradients"] + b["optimizer_states"]
    line = (
        f"~{m['memory_gib']:.2f} GiB per device at peak (weights+grads+AdamW {states:.2f}, activations"
        f" {b['activations']:.2f}, logits {b['logits_loss']:.2f}, FSDP buffers {b['fsdp_buffers']:.2f});"
        f" device has {m['device_memory_gib']:.1f} GiB"
    )
    if not m["fits"]:
        line += " -- LIKELY OOM"
    return line + "; details: python -m torchtitan.estimate"


def node_facts() -> str:
    """This node's GPUs as the estimator needs them (power limit in force, NVLink topology) and the flags that
    carry them into a plan (torchtitan/estimate/node_facts.py); information only."""
    from torchtitan.estimate.node_facts import probe

    facts = probe()
    return facts.describe() if facts else "no nvidia-smi here (no NVIDIA GPU): nothing to read"


def run_checks(cfg, world_size: int, nnodes: int | None = None, endpoint: str | None = None, out=None) -> int:
    """Run every check, print one line per check, return the exit code (0 all ok, 2 something failed)."""
    out = out or sys.stdout
    checks = [
        ("mesh", lambda: check_mesh(cfg, world_size)),
        ("nodes", lambda: check_nodes(cfg, world_size, nnodes)),
        ("tokenizer", lambda: check_tokenizer(cfg)),
        ("dataset", lambda: check_dataset(cfg)),
        ("validation", lambda: check_validation_data(cfg)),
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
    if not failures:  # the estimates need a valid mesh and model, so only when everything else passed
        print(f"preflight: {'memory':<10} info  {estimate_memory(cfg, world_size)}", file=out, flush=True)
        print(f"preflight: {'node':<10} info  {node_facts()}", file=out, flush=True)
        low_space = check_space(cfg)
        if low_space:
            print(f"preflight: {'disk':<10} WARN  {low_space}", file=out, flush=True)
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
    nnodes = _positive("nnodes", flags["nnodes"]) if "nnodes" in flags else None
    endpoint = flags.get("rdzv_endpoint")
    if endpoint is None and os.environ.get("MASTER_ADDR") and "TORCHELASTIC_RUN_ID" not in os.environ:
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}"
    cfg = parse_args(argv)
    validate(cfg)
    from torchtitan.simulate import Simulation, enabled

    if world_size is None and enabled(cfg):
        # the world the simulation would play a rank of, after the simulation's own checks (as the dry run does)
        world_size = Simulation(cfg).world_size
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
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
