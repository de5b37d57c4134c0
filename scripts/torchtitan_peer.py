#!/usr/bin/env python
"""Run PyPI torchtitan's trainer (the peer of scripts/bench_torchtitan.py) with one llama3 flavor added at run time.

    BENCH_TT_FLAVOR='{"name": "bench_8B-L16", "args": {"dim": 4096, "n_layers": 16, ...}}' \
        PYTHONPATH=/tmp/torchtitan_peer python scripts/torchtitan_peer.py --model.flavor bench_8B-L16 ...

Without BENCH_TT_FLAVOR it runs the peer unchanged (e.g. NGPU=8 ... --comm.mode=fake_backend for a simulated rank).
Shapes the peer's registry lacks (the 8B cut to 16 layers, the 1B) are added to its `llama3_args` dict before
its own entry point parses the command line, so the peer's source is never edited. Written against torchtitan
0.2.2 (TOML/CLI configs, `torchtitan.train.main(Trainer)`); another release with a different layout stops with
one line naming what is missing. Must be started with the peer, not this repository, first on sys.path.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    spec = json.loads(os.environ["BENCH_TT_FLAVOR"]) if os.environ.get("BENCH_TT_FLAVOR") else None
    try:
        import torchtitan
        from torchtitan.models import llama3
        from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs
        from torchtitan.train import Trainer
        from torchtitan.train import main as torchtitan_main
    except ImportError as e:
        print(
            f"error: the installed torchtitan does not have the 0.2.2 layout this launcher needs: {e}",
            file=sys.stderr,
        )
        return 2
    if spec:  # without BENCH_TT_FLAVOR the peer runs as released (its own flavors: 8B, 70B, 405B, ...)
        args = dict(spec["args"])
        if "rope_scaling_args" in args:
            args["rope_scaling_args"] = RoPEScalingArgs(**args["rope_scaling_args"])
        llama3.llama3_args[spec["name"]] = TransformerModelArgs(**args)
        print(f"bench: registered llama3 flavor {spec['name']}", flush=True)
    print(f"bench: torchtitan {torchtitan.__version__} from {torchtitan.__file__}", flush=True)
    torchtitan_main(Trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
