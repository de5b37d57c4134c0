"""Use what you trained: KV-cache generation and an inference benchmark over our checkpoints (or Hugging Face
ones through the converter). Shares the model file; adds no model code. Docs: docs/generate.md."""

from torchtitan.generate.benchmark import Prompt, format_table, read_prompts, run_benchmark
from torchtitan.generate.complete import Completions, complete, continuation
from torchtitan.generate.generator import Generation, generate, make_decode_step
from torchtitan.generate.loader import DTYPES, QUANTIZE, LoadedModel, load_model, quantize_weights
from torchtitan.generate.rouge import rouge1_f1
from torchtitan.generate.sampling import Sampling, sample

__all__ = [
    "DTYPES",
    "QUANTIZE",
    "Completions",
    "Generation",
    "LoadedModel",
    "Prompt",
    "Sampling",
    "complete",
    "continuation",
    "format_table",
    "generate",
    "load_model",
    "make_decode_step",
    "quantize_weights",
    "read_prompts",
    "rouge1_f1",
    "run_benchmark",
    "sample",
]
