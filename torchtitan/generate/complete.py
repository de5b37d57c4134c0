"""Text in, text out: tokenise prompts, generate in batches, decode the continuations.

A batch that runs out of device memory is not fatal: the batch size is halved (and stays halved for the rest
of the run), the same prompts are tried again, and the sizes that failed are reported. A single prompt that
does not fit is a user error. (Under tensor parallel an OOM on one rank cannot be recovered: the other ranks
are inside a collective; the run ends with the collective timeout.)
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

from torchtitan.data import Tokenizer
from torchtitan.errors import UserError
from torchtitan.generate.generator import Generation, generate, make_decode_step
from torchtitan.generate.loader import LoadedModel
from torchtitan.generate.sampling import Sampling
from torchtitan.log import logger


@dataclass
class Completions:
    texts: list[str]  # per prompt: the continuation (EOS not included)
    prompt_tokens: list[int]  # per prompt, BOS included
    new_tokens: list[int]  # per prompt, EOS included when generated
    batches: list[Generation] = field(default_factory=list)  # in order, with their timings
    batch_size: int = 0  # the size the run ended with (smaller than asked after an OOM)
    oom_batch_sizes: list[int] = field(default_factory=list)  # sizes that ran out of memory
    tokenize_s: float = 0.0
    detokenize_s: float = 0.0


def continuation(tokenizer: Tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text the new tokens add to the prompt's text. Decoding the new tokens alone can lose a leading space
    (sentencepiece drops the space of a word-initial piece at the start of a text), so decode prompt + new
    tokens and cut the prompt's decoding off the front where it matches."""
    new_ids = [t for t in new_ids if t != tokenizer.eos_id]
    body = [t for t in prompt_ids if t != tokenizer.bos_id]
    head, full = tokenizer.decode(body), tokenizer.decode(body + new_ids)
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(new_ids)


def complete(
    loaded: LoadedModel,
    tokenizer: Tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    sampling: Sampling,
    batch_size: int = 1,
    seed: int = 0,
    compile: bool = False,
) -> Completions:
    if batch_size < 1:
        raise UserError(f"--batch_size {batch_size} is invalid: must be >= 1")
    t0 = time.perf_counter()
    ids = [tokenizer.encode(p, bos=True) for p in prompts]
    out = Completions(
        texts=[""] * len(prompts), prompt_tokens=[len(i) for i in ids], new_tokens=[0] * len(prompts)
    )
    out.tokenize_s = time.perf_counter() - t0
    device = loaded.device
    generator = torch.Generator(device=device).manual_seed(seed)
    decode_step = make_decode_step(loaded.model, compile)
    # Compiled: one cache length for every batch (fixed shapes, no recompilation per batch).
    cache_len = max(out.prompt_tokens) + max_new_tokens if compile else None
    start = 0
    while start < len(ids):
        chunk = ids[start : start + batch_size]
        try:
            gen = generate(
                loaded.model,
                chunk,
                max_new_tokens,
                tokenizer.eos_id,
                sampling,
                generator,
                decode_step,
                cache_len=cache_len,
                static_shapes=compile,
                broadcast=loaded.broadcast,
            )
        except torch.OutOfMemoryError as e:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else "out of memory"
            if len(chunk) == 1:
                raise UserError(
                    f"a single prompt of {len(chunk[0])} tokens with --max_new_tokens {max_new_tokens} runs out of"
                    f" memory on {device} ({first}); lower --max_new_tokens, use --quantize, or more devices"
                ) from None
            out.oom_batch_sizes.append(len(chunk))
            batch_size = len(chunk) // 2
            logger.warning(
                f"a batch of {len(chunk)} prompts ran out of memory ({first}); halving to {batch_size}"
            )
            continue
        out.batches.append(gen)
        t1 = time.perf_counter()
        for i, (prompt_ids, new_ids) in enumerate(zip(chunk, gen.tokens)):
            out.texts[start + i] = continuation(tokenizer, prompt_ids, new_ids)
            out.new_tokens[start + i] = len(new_ids)
        out.detokenize_s += time.perf_counter() - t1
        start += len(chunk)
    out.batch_size = batch_size
    return out
