"""Entry point: `python train.py --job.config_file train_configs/debug_model.toml` or under torchrun."""

import sys

from torchtitan.train import main

if __name__ == "__main__":
    sys.exit(main())
