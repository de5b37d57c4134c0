"""Plan before you launch: memory, step time, tokens/s, MFU and GPU-hours of a training config, and generation
latency, analytically, with the trainer's FLOPs counter and hardware table (docs/estimate.md).

    python -m torchtitan.estimate --job.config_file train_configs/llama3_70b.toml \\
        --estimate.hardware h100-sxm --estimate.num_devices 256 --estimate.total_tokens 15e12
"""

from .inference import GenerationLatency, estimate_inference, generation_latency
from .plan import Calibration, Hardware, build_plan, resolve_hardware
from .training import estimate_plan, estimate_training

__all__ = [
    "Calibration",
    "GenerationLatency",
    "Hardware",
    "build_plan",
    "estimate_inference",
    "estimate_plan",
    "estimate_training",
    "generation_latency",
    "resolve_hardware",
]
