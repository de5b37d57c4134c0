"""Device memory numbers for the step log.

CUDA: the caching allocator's own counters. "active" is memory held by live tensors (what the model really
needs); "reserved" is what the allocator has taken from the driver (what nvidia-smi sees, and what runs out).
Peaks cover the interval since the last reset_peak(), so each log line shows that interval's high-water mark.
Retries (the allocator had to free its cache and try again: a sign of fragmentation, and slow) and OOMs are
cumulative over the run.
CPU: the process's resident set size, current and peak.
"""

import os
import resource
import sys

import torch

GIB = 2**30


def device_memory_gib(device: torch.device | str) -> float:
    """Total memory of the device: GPU memory for CUDA, physical RAM for CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GIB
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return float("nan")  # no sysconf (e.g. Windows): the CPU keys do not need it


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:  # fields: size resident shared ... in pages
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _max_rss_bytes() -> int:
    # Linux keeps the peak RSS as VmHWM, which reset_peak() can reset; ru_maxrss is the lifetime peak and the
    # fallback elsewhere (KiB on Linux, bytes on macOS).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


class MemoryMonitor:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.total_gib = device_memory_gib(self.device)
        self.reset_peak()

    def device_memory_gib(self) -> float:
        return self.total_gib

    def reset_peak(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        # Writing "5" to clear_refs resets VmHWM to the current RSS (Linux >= 4.0, proc(5)). Where that is
        # not allowed the CPU peak simply stays the lifetime peak.
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def snapshot(self) -> dict[str, float]:
        if self.is_cuda:
            stats = torch.cuda.memory_stats(self.device)
            active = stats.get("active_bytes.all.peak", 0) / GIB
            reserved = stats.get("reserved_bytes.all.peak", 0) / GIB
            return {
                "memory/max_active_gib": active,
                "memory/max_active_pct": 100 * active / self.total_gib,
                "memory/max_reserved_gib": reserved,
                "memory/max_reserved_pct": 100 * reserved / self.total_gib,
                "memory/alloc_retries": float(stats.get("num_alloc_retries", 0)),
                "memory/ooms": float(stats.get("num_ooms", 0)),
            }
        max_rss = _max_rss_bytes()
        rss = _rss_bytes()
        rss = max_rss if rss is None else rss
        # Read a moment apart, so take the max: the peak can never be below the current value.
        return {"memory/rss_gib": rss / GIB, "memory/max_rss_gib": max(rss, max_rss) / GIB}
