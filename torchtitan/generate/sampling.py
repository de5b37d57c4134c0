"""Choosing the next token from the last position's logits: greedy, temperature, top-k, top-p.

The order is the usual one (as in Hugging Face's logits processors): divide by the temperature, keep the k
most likely tokens, keep the smallest set of the most likely tokens whose probability adds up to at least p,
renormalize, draw. Temperature 0 means greedy (argmax; the first index wins a tie), whatever k and p say.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchtitan.errors import UserError


@dataclass
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None  # None = no top-k cut
    top_p: float | None = None  # None = no nucleus cut

    def __post_init__(self):
        if self.temperature < 0:
            raise UserError(f"--temperature {self.temperature} is invalid: must be >= 0 (0 = greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"--top_k {self.top_k} is invalid: must be >= 1 (or left out for no top-k cut)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UserError(f"--top_p {self.top_p} is invalid: must be in (0, 1] (or left out for no cut)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(logits: torch.Tensor, s: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, vocab] -> token ids [B] (int64)."""
    if s.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / s.temperature
    if s.top_k is not None and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens before it already reach p: the most likely token always stays
        drop = probs.cumsum(dim=-1) - probs >= s.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
