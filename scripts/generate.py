"""Generate text from a checkpoint with a KV cache, or benchmark inference over a prompt file.

    python scripts/generate.py --job.config_file train_configs/debug_model.toml \\
        --checkpoint outputs/debug_model/checkpoint --prompt "Once upon a time" --max_new_tokens 50
    python scripts/generate.py --job.config_file train_configs/debug_model.toml --checkpoint CKPT \\
        --prompts tests/assets/debug_corpus/prompts.jsonl --benchmark --batch_size 8 --json bench.json
    torchrun --nproc_per_node 2 scripts/generate.py ...      # tensor parallel over 2 processes

With --prompt, stdout holds the prompt and its continuation and nothing else (logs go to stderr). With
--prompts (jsonl, {"prompt": ..., "reference": ...} per line), one {"prompt", "completion"} JSON object per
line; with --benchmark, the benchmark table (and --json OUT the full result), with the estimator's predicted
prefill and decode latency next to the measured ones (on a CPU give its rates: --estimate.peak_tflops,
--estimate.hbm_bandwidth_gbps). The trainer's --section.key options apply too: the model shape and the tokenizer
come from the job config. Docs: docs/generate.md.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan import gc_policy  # noqa: E402

gc_policy.pause()  # before torch's imports, until the model is loaded (torchtitan/gc_policy.py)

import torch  # noqa: E402

from torchtitan.config import help_text, parse_args, validate  # noqa: E402
from torchtitan.data import build_tokenizer  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402
from torchtitan.generate import (  # noqa: E402
    DTYPES,
    QUANTIZE,
    Prompt,
    Sampling,
    complete,
    format_table,
    load_model,
    read_prompts,
    run_benchmark,
)
from torchtitan.generate.benchmark import device_name  # noqa: E402
from torchtitan.log import init_logger, logger  # noqa: E402
from torchtitan.parallel import pick_device  # noqa: E402
from torchtitan.parallel.distributed import exit_process  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
        epilog="Any trainer option --section.key=value also applies (listed below).",
    )
    p.add_argument(
        "--checkpoint", required=True, help="DCP step folder, checkpoint folder or Hugging Face folder"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one prompt; stdout gets the prompt and its continuation")
    src.add_argument("--prompts", help='jsonl file of {"prompt": ..., "reference": ...} objects')
    p.add_argument("--max_new_tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top_k", type=int, default=None, help="sample from the k most likely tokens only")
    p.add_argument(
        "--top_p", type=float, default=None, help="sample from the smallest set with probability >= p"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (default 0)")
    p.add_argument("--batch_size", type=int, default=8, help="prompts per batch with --prompts (default 8)")
    p.add_argument("--benchmark", action="store_true", help="measure latency, throughput, memory, ROUGE-1")
    p.add_argument("--json", help="write the completions (or the benchmark result) to this JSON file")
    p.add_argument("--quantize", choices=QUANTIZE, default=None, help="torchao weight-only quantization")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    p.add_argument(
        "--dtype", choices=list(DTYPES), default="bfloat16", help="weights and compute (default bf16)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if "-h" in argv or "--help" in argv:
        print(parser.format_help())
        print(help_text())
        return 0
    a, rest = parser.parse_known_args(argv)
    rank = int(os.environ.get("RANK", 0))
    init_logger(rank, stream=sys.stderr)
    try:
        cfg = parse_args(rest)
        validate(cfg)
        sampling = Sampling(a.temperature, a.top_k, a.top_p)
        if a.prompt is None and a.prompts is None:
            raise UserError("give --prompt TEXT or --prompts FILE.jsonl")
        prompts = [Prompt(a.prompt)] if a.prompt is not None else read_prompts(a.prompts)
        tokenizer = build_tokenizer(cfg.model.tokenizer_path)
        device = pick_device()
        t0 = time.perf_counter()
        loaded = load_model(cfg, a.checkpoint, device, DTYPES[a.dtype], a.quantize)
        load_s = time.perf_counter() - t0
        if tokenizer.vocab_size > loaded.args.vocab_size:
            raise UserError(
                f"tokenizer {cfg.model.tokenizer_path} has {tokenizer.vocab_size} tokens but the checkpoint's"
                f" model has {loaded.args.vocab_size}: set --model.tokenizer_path to the tokenizer it was trained with"
            )
        logger.info(
            f"loaded {loaded.source} in {load_s:.1f} s: {loaded.args.num_params():,} parameters, {a.dtype}"
            f"{', ' + a.quantize if a.quantize else ''}, {device_name(device)}"
            f"{f', tensor parallel {loaded.world_size}' if loaded.world_size > 1 else ''}"
        )
        gc_policy.resume(automatic=True)
        if a.benchmark:
            settings = {
                "checkpoint": loaded.source,
                "parameters": loaded.args.num_params(),
                "dtype": a.dtype,
                "quantize": a.quantize,
                "compile": a.compile,
                "device": device_name(device),
                "tensor_parallel": loaded.world_size,
                "threads": torch.get_num_threads(),
                "max_new_tokens": a.max_new_tokens,
                "temperature": a.temperature,
                "top_k": a.top_k,
                "top_p": a.top_p,
                "seed": a.seed,
                "torch": torch.__version__,
                "load_s": load_s,
            }
            result = run_benchmark(
                loaded,
                tokenizer,
                prompts,
                a.max_new_tokens,
                sampling,
                a.batch_size,
                a.seed,
                a.compile,
                settings,
                estimate=cfg.estimate,
                weight_dtype=a.quantize or a.dtype,
            )
            if rank == 0:
                print(format_table(result))
                if a.json:
                    Path(a.json).write_text(json.dumps(result, indent=2))
            return 0
        out = complete(
            loaded, tokenizer, [p.prompt for p in prompts], a.max_new_tokens, sampling, a.batch_size, a.seed,
            a.compile,
        )  # fmt: skip
        if rank == 0:
            if a.prompt is not None:
                sys.stdout.write(a.prompt + out.texts[0] + "\n")
            else:
                for p, text in zip(prompts, out.texts):
                    print(json.dumps({"prompt": p.prompt, "completion": text}))
            if a.json:
                rows = [{"prompt": p.prompt, "completion": t} for p, t in zip(prompts, out.texts)]
                Path(a.json).write_text(json.dumps(rows, indent=2))
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if torch.distributed.is_initialized():
            if sys.exc_info()[0] is None:
                # Leave together, as the trainer does: rank 0 is still writing its output when the others finish,
                # and gloo aborts a peer whose pairs close mid-teardown (SIGABRT after a successful run).
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())  # skips the interpreter's final teardown (see there)
