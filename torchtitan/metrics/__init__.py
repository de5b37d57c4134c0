"""What the framework reports and where (definitions: docs/metrics.md)."""

from .hardware import PeakFlops, cpu_bf16_warning, resolve_peak
from .memory import MemoryMonitor
from .processor import MetricsProcessor
from .sinks import JsonlSink, TensorBoardSink, format_line, read_tensorboard_scalars

__all__ = [
    "PeakFlops",
    "cpu_bf16_warning",
    "resolve_peak",
    "MemoryMonitor",
    "MetricsProcessor",
    "JsonlSink",
    "TensorBoardSink",
    "format_line",
    "read_tensorboard_scalars",
]
