"""Counter-based random initialization: each element's value is a pure function of its position in the full tensor.

value(seed, name, (i_0, ..., i_n-1)) for the element at coordinates (i_0, ...) of the FULL (unsharded) parameter:

    H_d(i) = mix32(mix32(i ^ a_d) ^ b_d)                  a_d, b_d: 64 bits of blake2b(f"{seed}/{name}/{d}")
    h = mix32(H_0(i_0) ^ H_1(i_1) ^ ... )                 one 32-bit hash per element
    u = (floor(h / 2^8) + 1/2) / 2^24                     a uniform in (0, 1) from h's top 24 bits (exact in fp32)
    x = std * sqrt(2) * erfinv(2 * (Phi(a) + u * (Phi(b) - Phi(a))) - 1)      a = -cutoff, b = +cutoff

`mix32` is the "lowbias32" integer hash from Chris Wellons' hash-prospector (xorshift-multiply, a bijection on 32
bits; published constants 0x7feb352d and 0x846ca68b). The last line is the inverse-CDF method: a uniform mapped
through the normal quantile function restricted to [Phi(a), Phi(b)] is exactly a normal truncated to [a, b], with
no rejection loop, so every element is computed independently (Devroye, "Non-Uniform Random Variate Generation",
1986, section II.2). An untruncated normal is the case a = -inf, b = +inf; its tails end at about 5.4 std
(2u - 1 stays 2^-24 away from -1 and 1).

Why this design:
  * A process computes exactly the elements it holds: a column (Shard(1)) shard, a strided FSDP x TP shard or a
    pipeline stage costs its own size, never the full parameter, and no element is drawn twice.
  * The values do not depend on how the tensor is split, blocked, or which device computes them, so for one seed
    the full weights are identical in every layout (bitwise on one device type; CPU and CUDA `erfinv` may differ
    in the last bit).
  * Per element it is one XOR, one hash round and the float map: 15-16 elementwise passes, in place on
    cache-sized blocks (no full-size temporaries), vectorized on any device. The per-coordinate hashes H_d cost
    sum(shape), not prod(shape). Measured throughput: docs/performance.md.
  * The final round matters: without it, h(r, c) ^ h(r', c) would be the same for every column c (rows would be
    XOR-shifted copies of each other). Two keyed rounds per coordinate make the coordinate hashes of different
    parameters, seeds and dimensions unrelated.
  * The per-element round runs on int32, the 32-bit pattern of h read as a signed number: half the memory
    traffic of int64 and twice the vector lanes (3.7x faster on a 2-core AMD EPYC VM). Products wrap modulo 2^32
    (two's complement: the low 32 bits of a product do not depend on signedness; CPU vector multiplies and CUDA
    integer multiplies wrap), and a right shift is arithmetic on int32, so each one is followed by a mask that
    clears the copied sign bits: a logical shift. tests/test_model.py checks the round against exact integers.
    The per-coordinate hashes run on int64 with products kept below 2^63: the first constant is below 2^31; the
    second is split as (c - 2^31) + 2^31, and x * 2^31 mod 2^32 is just the low bit of x shifted up.
"""

from __future__ import annotations

import hashlib
import math

import torch

_MASK32 = 0xFFFFFFFF
_C1 = 0x7FEB352D  # < 2^31: x * _C1 < 2^63 for x < 2^32
_C2_LOW = 0x846CA68B - (1 << 31)  # 0x846ca68b = _C2_LOW + 2^31


def mix32(x):
    """lowbias32 on values in [0, 2^32): works on Python ints and int64 tensors alike (same results)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _C2_LOW + ((x & 1) << 31)) & _MASK32
    return x ^ (x >> 16)


def _dim_keys(seed: int, name: str, dim: int) -> tuple[int, int]:
    """Two 32-bit keys for one dimension of one parameter: blake2b of f"{seed}/{name}/{dim}" (stable everywhere)."""
    digest = hashlib.blake2b(f"{seed}/{name}/{dim}".encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")


def coordinate_hashes(seed: int, name: str, dim: int, index: torch.Tensor) -> torch.Tensor:
    """H_d(i) = mix32(mix32(i ^ a) ^ b) for the indices `index` along dimension `dim` (int64, < 2^32)."""
    a, b = _dim_keys(seed, name, dim)
    return mix32(mix32(index.to(torch.int64) ^ a) ^ b)


def _phi(x: float) -> float:
    """Standard normal CDF (float64, host)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


_C2_INT32 = 0x846CA68B - (1 << 32)  # the second constant's 32-bit pattern as a signed int32


def as_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> int32 tensors with the same 32-bit pattern (exact, no narrowing overflow)."""
    return torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)


def _mix32_top_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """mix32 in place on int32 bit patterns (see the module docstring), without its final `x ^= x >> 16`.

    That last step only folds the high half into the low half; `_Normal` reads the top 24 bits, which the last
    multiply has already mixed. No allocation: every op writes into `x` or `tmp`.
    """
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp.bitwise_and_(0xFFFF))  # x ^= x >>> 16
    x.mul_(_C1)
    torch.bitwise_right_shift(x, 15, out=tmp)
    x.bitwise_xor_(tmp.bitwise_and_(0x1FFFF))  # x ^= x >>> 15
    x.mul_(_C2_INT32)


class _Normal:
    """The map from a 32-bit hash h (int32 pattern) to a (truncated) normal value, evaluated in float32."""

    def __init__(self, std: float, cutoff: float):
        lo, hi = (0.0, 1.0) if math.isinf(cutoff) else (_phi(-cutoff), _phi(cutoff))
        # t = 2p - 1 with p = lo + u * (hi - lo) and u = (top24 + 1/2) / 2^24, in one multiply-add. top24 < 2^24
        # is exact in float32; untruncated, scale and shift are powers of two apart from -1 and the extremes
        # -1 + 2^-24 and 1 - 2^-24 are exact, so t never reaches +-1 (rounding is monotonic). Truncated, the
        # result is clamped to the cutoff (rounding must not step outside).
        self.scale = 2.0**-24 * 2.0 * (hi - lo)
        self.shift = 2.0 * lo - 1.0 + 0.5 * self.scale
        self.std = math.sqrt(2.0) * std
        self.bound = None if math.isinf(cutoff) else cutoff * std

    def __call__(self, h: torch.Tensor, tmp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        torch.bitwise_right_shift(h, 8, out=tmp).bitwise_and_(0xFFFFFF)  # top 24 bits of the 32-bit pattern
        torch.mul(tmp, self.scale, out=out).add_(self.shift)
        torch.erfinv(out, out=out).mul_(self.std)  # sqrt(2) * erfinv(t): the normal quantile of p
        return out if self.bound is None else out.clamp_(-self.bound, self.bound)


def block_elements(device: torch.device) -> int:
    """Elements per evaluation block. CPU: 2^16 (each op's 256 KiB operands stay in cache, and 2^16 is twice
    torch's per-thread grain, so both threads work); GPUs: 2^22 (few launches, 48 MiB of scratch)."""
    return 1 << 16 if device.type == "cpu" else 1 << 22


@torch.no_grad()
def fill_normal(
    local: torch.Tensor,
    coords: list[torch.Tensor],
    seed: int,
    name: str,
    std: float,
    cutoff: float,
) -> None:
    """Write into `local` the values of the elements of parameter `name` it holds.

    `coords[d]` lists, for each position along dimension d of `local`, its index in the full parameter (a shard
    of any DTensor layout is the cartesian product of such per-dimension index sets). Values are computed on
    coords' device, one block of rows at a time in preallocated scratch tensors, and copied into `local` (which
    may live elsewhere, e.g. in CPU memory under FSDP CPU offload).
    """
    if local.numel() == 0:
        return
    if local.ndim == 0:
        raise ValueError(
            f"init: parameter {name} is a scalar; counter-based init needs at least one dimension"
        )
    device = coords[0].device
    # XOR of the other dimensions' coordinate hashes, one vector over a row of `local` (all dims but the first)
    inner = torch.zeros((), dtype=torch.int64, device=device)
    for d in range(1, local.ndim):
        inner = inner.unsqueeze(-1) ^ coordinate_hashes(seed, name, d, coords[d])
    inner = as_int32(inner.reshape(1, -1))
    first = as_int32(coordinate_hashes(seed, name, 0, coords[0]))
    normal = _Normal(std, cutoff)
    target = (
        local if local.is_contiguous() else torch.empty_like(local, memory_format=torch.contiguous_format)
    )
    rows = target.view(local.shape[0], -1)
    step = max(1, block_elements(device) // inner.shape[1])
    h = torch.empty((min(step, rows.shape[0]), inner.shape[1]), dtype=torch.int32, device=device)
    tmp, value = torch.empty_like(h), torch.empty(h.shape, dtype=torch.float32, device=device)
    direct = rows.dtype == torch.float32 and rows.device == device  # compute straight into the parameter
    for r0 in range(0, rows.shape[0], step):
        r1 = min(r0 + step, rows.shape[0])
        n = r1 - r0
        torch.bitwise_xor(first[r0:r1, None], inner, out=h[:n])
        _mix32_top_(h[:n], tmp[:n])
        if direct:
            normal(h[:n], tmp[:n], out=rows[r0:r1])
        else:
            rows[r0:r1].copy_(normal(h[:n], tmp[:n], out=value[:n]))
    if target is not local:
        local.copy_(target)


def full_coords(param: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Default `local_coords`: an unsharded parameter holds every index of every dimension."""
    if hasattr(param, "device_mesh"):
        raise TypeError("init_weights: parameter is a DTensor; pass local_coords from torchtitan.parallel")
    return param, [torch.arange(n, device=param.device) for n in param.shape]
