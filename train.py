"""Entry point: `python train.py --job.config_file train_configs/debug_model.toml` or under torchrun."""

from torchtitan import gc_policy

gc_policy.pause()  # before torch's imports: train() resumes the cyclic GC once the run is built (gc_policy.py)

from torchtitan.parallel.distributed import exit_process  # noqa: E402
from torchtitan.train import main  # noqa: E402

if __name__ == "__main__":
    exit_process(main())  # skips the interpreter's final teardown (see there)
