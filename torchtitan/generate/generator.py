"""KV-cache generation for a batch of prompts of different lengths.

Layout of a batch (B prompts, the longest P tokens, N new tokens at most):

    slot      0   1   2   3   4 | 5   6   7 ...        cache of P + N slots, the same slots for every row
    row 0     a   b   c   d   e | x   y   z            the longest prompt: positions 0..4, then 5, 6, ...
    row 1     .   .   f   g   h | u   v   w            left padding: positions 0..2 at slots 2..4, then 3, 4, ...

Prompts are left-padded so that every row's last prompt token sits in slot P-1 and every row's next token goes
into the same slot: one forward per step for the whole batch. Padding is invisible to the real tokens: each
token gets the RoPE position of its own row (slot - padding), and the attention mask lets a real token see only
its own row's real tokens up to itself (pad queries see only themselves, so no mask row is empty). The result
is the same as running every prompt alone (tests/test_generate.py checks it token for token against full
recomputation without a cache).

Prefill runs the prompts once and fills slots 0..P-1; then each decode step feeds one token per row and fills
one slot. A row that produced EOS stops: it keeps running with the batch (its later tokens are discarded) until
every row has stopped or N tokens are reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from torchtitan.errors import UserError
from torchtitan.generate.sampling import Sampling, sample
from torchtitan.models.llama3.model import CacheStep, Transformer
from torchtitan.testing import faults


@dataclass
class Generation:
    """What generate() returns for one batch. Times are seconds of wall clock, measured after the device
    finished (the host reads every step's tokens to check for EOS, which waits for the device)."""

    tokens: list[list[int]]  # per prompt: its new tokens, ending with eos_id where the row stopped on EOS
    prefill_s: float  # the prompts' forward pass (caches filled, last position's logits)
    first_token_s: float  # prefill + sampling the first new token, until the host has it
    decode_s: list[float] = field(default_factory=list)  # each decode step: one new token for every row

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def make_decode_step(model: Transformer, compile: bool = False) -> Callable:
    """The function a decode step calls: the model itself, or the model compiled (prefill always runs eager:
    its shape changes with every batch, and it runs once per batch)."""
    return torch.compile(model) if compile else model


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_id: int,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    decode_step: Callable | None = None,
    cache_len: int | None = None,
    static_shapes: bool = False,
    broadcast: Callable[[torch.Tensor], None] | None = None,
) -> Generation:
    """Generate up to max_new_tokens tokens after each prompt (token ids, BOS included if wanted).

    generator:     torch.Generator on the model's device for sampling (None = torch's default); the same seed,
                   prompts and batch give the same tokens.
    decode_step:   what runs a decode step (make_decode_step: eager or compiled model); default the model.
    cache_len:     KV-cache slots (>= longest prompt + max_new_tokens); a fixed value across batches keeps
                   compiled shapes fixed.
    static_shapes: attend over all cache_len slots in every decode step (unwritten ones masked) instead of the
                   written ones only: the same shapes every step, so a compiled step never recompiles.
    broadcast:     under tensor parallelism, copies rank 0's sampled tokens to every rank in place.
    """
    sampling = sampling or Sampling()
    decode_step = model if decode_step is None else decode_step
    if max_new_tokens < 1:
        raise UserError(f"--max_new_tokens {max_new_tokens} is invalid: must be >= 1")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token (an empty prompt was given)")
    device = model.freqs_cis.device
    batch, longest = len(prompts), max(len(p) for p in prompts)
    needed = longest + max_new_tokens
    max_seq_len = model.freqs_cis.shape[0]
    if needed > max_seq_len:
        raise UserError(
            f"a prompt of {longest} tokens + --max_new_tokens {max_new_tokens} = {needed} positions exceed the"
            f" model's max_seq_len {max_seq_len} (its RoPE table); shorten the prompt, lower --max_new_tokens"
            f" or set --model.max_seq_len"
        )
    cache_len = max(cache_len or needed, needed)
    faults.oom_above(batch)

    pad = torch.tensor([longest - len(p) for p in prompts], device=device)
    tokens = torch.tensor([[0] * (longest - len(p)) + p for p in prompts], device=device)
    slot_ids = torch.arange(cache_len, device=device)
    # valid[b, s]: slot s of row b holds a real token (written so far); padding and future slots do not
    valid = (slot_ids[None, :] >= pad[:, None]) & (slot_ids[None, :] < longest)
    slots = slot_ids[:longest]
    causal = slots[:, None] >= slots[None, :]
    eye = slots[:, None] == slots[None, :]
    prefill = CacheStep(
        positions=(slots[None, :] - pad[:, None]).clamp(min=0),
        slots=slots,
        mask=(causal & (valid[:, None, :longest] | eye))[:, None],
    )

    def pick(logits: torch.Tensor) -> torch.Tensor:
        nxt = sample(logits[:, -1], sampling, generator)
        if broadcast is not None:
            broadcast(nxt)
        return nxt

    model.setup_kv_cache(cache_len)
    try:
        t0 = time.perf_counter()
        logits = model(tokens, prefill)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prefill_s = time.perf_counter() - t0
        nxt = pick(logits)
        out, done = [nxt], nxt == eos_id
        all_done = bool(done.all())  # waits for the device
        result = Generation([], prefill_s, time.perf_counter() - t0)
        for i in range(1, max_new_tokens):
            if all_done:
                break
            t1 = time.perf_counter()
            slot = longest + i - 1  # where the token fed now goes
            valid[:, slot] = True
            step = CacheStep(
                positions=(slot - pad)[:, None],
                slots=slot_ids[slot : slot + 1],
                mask=valid[:, None, None, : cache_len if static_shapes else slot + 1],
            )
            nxt = torch.where(done, eos_id, pick(decode_step(nxt[:, None], step)))
            out.append(nxt)
            done = done | (nxt == eos_id)
            all_done = bool(done.all())
            result.decode_s.append(time.perf_counter() - t1)
    finally:
        model.setup_kv_cache(None)
    for row in torch.stack(out, dim=1).tolist():
        result.tokens.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return result
