"""Entry point: `python train.py --job.config_file train_configs/debug_model.toml` or under torchrun."""

from torchtitan.parallel.distributed import exit_process
from torchtitan.train import main

if __name__ == "__main__":
    exit_process(main())  # skips the interpreter's teardown in a multi-process run (see there)
