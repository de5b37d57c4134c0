#!/usr/bin/env python
"""Perplexity of a checkpoint on held-out data, in any parallel layout (the trainer's validation code).

    python scripts/perplexity.py --job.config_file train_configs/debug_model.toml \\
        --checkpoint outputs/debug_model/checkpoint/step-100
    torchrun --nproc_per_node 2 scripts/perplexity.py --job.config_file ... --checkpoint ... \\
        --parallelism.tensor_parallel_degree=2 --validation.steps=20 --validation.split=validation
    python scripts/perplexity.py --job.config_file X.toml --checkpoint path/to/hf-llama-folder

--checkpoint is found as scripts/generate.py finds it: a step folder of a training run (full checkpoint or
model-only export; any layout), a checkpoint folder (its newest committed step), or a Hugging Face Llama folder
(config.json + safetensors, converted in memory; the shape comes from its config.json, and its vocab_size must
equal the tokenizer's). The tokenizer and the data come from the job config: the trainer's validation set,
[validation] dataset / dataset_path / split, `steps` batches of `global_batch_size` sequences of
training.seq_len tokens. On the same layout the result equals, bit for bit, the validation/loss the trainer
logged at that step; on others it agrees up to the order of floating-point sums. Prints one line (rank 0):
perplexity, loss, tokens; --json FILE also writes them as JSON. Errors: one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan import gc_policy  # noqa: E402

gc_policy.pause()  # before torch's imports, until the configuration is read (torchtitan/gc_policy.py)

import torch.distributed as dist  # noqa: E402

from torchtitan.config import parse_args, validate  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402
from torchtitan.evaluate import evaluate_checkpoint  # noqa: E402
from torchtitan.metrics.processor import validation_metrics  # noqa: E402
from torchtitan.parallel.distributed import exit_process  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="other --section.key=value: the trainer's"
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="DCP step folder (full or model-only export), checkpoint folder or Hugging Face Llama folder",
    )
    p.add_argument("--json", default=None, help="also write the result to this JSON file")
    a, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse_args(rest)
        validate(cfg)
        gc_policy.resume(automatic=True)
        result, step = evaluate_checkpoint(cfg, a.checkpoint)
        m = validation_metrics(result.loss_sum, result.tokens)
        if dist.get_rank() == 0:
            v = cfg.validation
            source = v.dataset_path or f"{v.dataset or cfg.data.dataset} split {v.split}"
            print(
                f"perplexity {m['validation/perplexity']:.4f}  loss {m['validation/loss']:.6f}  {result.tokens:,}"
                f" tokens ({result.batches} batches of {result.tokens // result.batches:,}) of {source};"
                f" checkpoint {a.checkpoint} ({'Hugging Face' if step is None else f'step {step}'}),"
                f" {dist.get_world_size()} process(es)"
            )
            if a.json:
                record = {
                    "checkpoint": a.checkpoint,
                    "step": step,
                    "loss": m["validation/loss"],
                    "perplexity": m["validation/perplexity"],
                    "tokens": result.tokens,
                    "batches": result.batches,
                    "world_size": dist.get_world_size(),
                }
                Path(a.json).write_text(json.dumps(record, indent=1) + "\n")
        dist.barrier()  # leave together (a rank tearing down gloo while a peer still talks makes the peer abort)
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())  # skips the interpreter's final teardown (see there)
