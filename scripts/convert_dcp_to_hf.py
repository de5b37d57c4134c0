"""Convert our DCP checkpoint (a training checkpoint, a model-only export or a converted one) to Hugging Face
Llama format: config.json + safetensors (sharded with model.safetensors.index.json above --max_shard_gb).

    python scripts/convert_dcp_to_hf.py outputs/debug_model/checkpoint/step-100 hf_out --flavor debugmodel
The model shape comes from --flavor (with --vocab_size / --max_seq_len overrides), or from the config.json a
converted folder carries.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.checkpoint.hf import dcp_to_hf, model_args_from_hf_config  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402
from torchtitan.models import build_model_args  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dcp_dir")
    p.add_argument("out_dir")
    p.add_argument("--flavor", default=None, help="llama3 flavor (default: config.json inside dcp_dir)")
    p.add_argument("--vocab_size", type=int, default=None)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="cast (default: keep)")
    p.add_argument("--max_shard_gb", type=float, default=5.0)
    a = p.parse_args(argv)
    try:
        if a.flavor:
            over = {k: v for k, v in (("vocab_size", a.vocab_size), ("max_seq_len", a.max_seq_len)) if v}
            args = build_model_args("llama3", a.flavor, **over)
        else:
            cfg = Path(a.dcp_dir) / "config.json"
            if not cfg.is_file():
                raise UserError(f"{cfg} does not exist; pass --flavor to give the model shape")
            args = model_args_from_hf_config(json.loads(cfg.read_text()))
        dtype = getattr(torch, a.dtype) if a.dtype else None
        dcp_to_hf(a.dcp_dir, a.out_dir, args, dtype, int(a.max_shard_gb * 2**30))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
