"""When Python's cyclic garbage collector runs: paused through start-up, then at fixed steps (or automatic).

Start-up. Importing torch, torch.distributed.tensor, torch._dynamo and datasets leaves ~590,000 objects that the
cyclic GC tracks, and the automatic collections their allocation triggers walk the survivors again and again:
those imports took 3.2 CPU-s with the GC on and 2.3 with it paused (this project's 2-core CPU VM, torch 2.13). So
an entry point calls `pause()` before its imports, and the run calls `resume()` once it is built; the one
collection that ends the pause walks everything once (0.2 s). Measured on the debug model's 4-step run
(docs/performance.md, "Python's cyclic GC paused through start-up"): 3.75 -> 3.33 CPU-s per process, peak RSS
+1.5 MiB.

Training. The trainer leaves automatic collection off (`training.gc_freq` > 0) and collects at fixed steps, on
all ranks at once, instead of a ~100 ms pause at a random step of a random rank (train.py).

This module imports nothing but `gc`: entry points import it before torch.
"""

from __future__ import annotations

import gc


def pause() -> None:
    """No automatic collection until `resume()`: the first thing an entry point does, before its imports."""
    gc.disable()


def resume(automatic: bool) -> None:
    """End the start-up pause: one collection of the young generations (everything made since `pause()` is
    still young), then automatic collection again, or none (the caller collects at fixed points)."""
    gc.collect(1)
    if automatic:
        gc.enable()
    else:
        gc.disable()
