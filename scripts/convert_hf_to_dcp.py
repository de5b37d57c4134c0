"""Convert a Hugging Face Llama 3 checkpoint (config.json + safetensors) into our DCP format.

python scripts/convert_hf_to_dcp.py /path/to/Llama-3.2-1B outputs/llama3_1b_dcp [--dtype bfloat16]
./run_train.sh --checkpoint.initial_load_path=outputs/llama3_1b_dcp --model.flavor=1B ...
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.checkpoint.hf import hf_to_dcp  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf_dir", help="folder with config.json and model.safetensors (or shards + index)")
    p.add_argument("out_dir", help="DCP folder to write (usable as checkpoint.initial_load_path)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="cast (default: keep)")
    a = p.parse_args(argv)
    try:
        args = hf_to_dcp(a.hf_dir, a.out_dir, getattr(torch, a.dtype) if a.dtype else None)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out_dir}: {args.n_layers} layers, dim {args.dim}, vocab {args.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
