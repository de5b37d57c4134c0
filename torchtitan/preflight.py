"""Check a launch without starting it: config, mesh for the world size, tokenizer/vocabulary.

    python -m torchtitan.preflight --world_size 8 --job.config_file train_configs/llama3_8b.toml [--section.key=value ...]

Prints "preflight ok: ..." and exits 0, or one line "error: ..." and exits 2. run_train.sh calls it before torchrun.
"""

from __future__ import annotations

import sys

from torchtitan.config import help_text, parse_args, validate
from torchtitan.errors import UserError


def preflight(argv: list[str]) -> str:
    world_size = 1
    if argv and argv[0].startswith("--world_size"):
        if "=" in argv[0]:
            value, argv = argv[0].split("=", 1)[1], argv[1:]
        else:
            value, argv = (argv[1] if len(argv) > 1 else ""), argv[2:]
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"preflight: --world_size must be a positive integer, got {value!r}")
        world_size = int(value)
    cfg = parse_args(argv)
    validate(cfg)

    from torchtitan.data import build_tokenizer, check_vocab
    from torchtitan.models import model_args_from_config
    from torchtitan.parallel.dims import ParallelDims

    dims = ParallelDims.from_config(cfg.parallelism, world_size)
    model_args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims.validate(model_args, cfg)
    tokenizer = build_tokenizer(cfg.model.tokenizer_path)
    check_vocab(tokenizer, model_args.vocab_size, cfg.model.tokenizer_path)
    return f"preflight ok: {cfg.model.name} {cfg.model.flavor}, {dims.describe()}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(help_text())
        return 0
    try:
        print(preflight(argv))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
