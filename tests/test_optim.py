"""LR schedule shape, weight-decay groups, gradient clipping, and the throughput/MFU formulas."""

import math

import pytest
import torch

from torchtitan.config import parse_args
from torchtitan.metrics.hardware import PeakFlops
from torchtitan.metrics.processor import throughput_metrics
from torchtitan.models.llama3 import Transformer
from torchtitan.models.llama3.args import ModelArgs
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_, lr_factor


def test_warmup_then_linear_decay_to_floor():
    f = [lr_factor(s, 100, 10, None, "linear", 0.1) for s in range(1, 101)]
    assert f[0] == pytest.approx(1 / 11) and f[0] > 0  # the first step learns
    assert f[9] == pytest.approx(10 / 11)
    assert all(a < b for a, b in zip(f[:10], f[1:11]))  # rising through warmup
    assert f[10] < 1.0 and all(a >= b for a, b in zip(f[10:], f[11:]))  # then falling
    assert f[-1] == pytest.approx(0.1)  # the floor, reached at the last step


def test_warmup_stable_decay_and_cosine():
    f = [lr_factor(s, 100, 10, 0.2, "cosine", 0.0) for s in range(1, 101)]
    assert all(v == 1.0 for v in f[10:80])  # stable phase
    assert f[89] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway through the cosine decay
    assert f[-1] == pytest.approx(0.0, abs=1e-12)


def test_scheduler_drives_optimizer_lr():
    cfg = parse_args(["--training.steps=20", "--lr_scheduler.warmup_steps=4", "--optimizer.lr=0.01"])
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer([model], cfg)
    sched = build_lr_scheduler(opt, cfg)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[0] == pytest.approx(0.01 / 5)
    assert seen[3] == pytest.approx(0.01 * 4 / 5)
    assert seen[-1] == pytest.approx(0.0, abs=1e-12)


def test_no_weight_decay_on_norms_and_embeddings():
    cfg = parse_args(["--optimizer.weight_decay=0.1"])
    model = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16))
    opt = build_optimizer([model], cfg)
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in no_decay["params"]} == {
        "tok_embeddings.weight",
        "layers.0.attention_norm.weight",
        "layers.0.ffn_norm.weight",
        "norm.weight",
    }
    assert "output.weight" in {names[id(p)] for p in decay["params"]}


def test_clip_grad_norm_returns_preclip_norm_and_clips():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.full((3,), 3.0), torch.full((4,), 4.0)
    norm = clip_grad_norm_([a, b], max_norm=1.0)
    assert norm.item() == pytest.approx(math.sqrt(9 * 3 + 16 * 4))
    assert torch.cat([a.grad, b.grad]).norm().item() == pytest.approx(1.0, rel=1e-5)
    a.grad = torch.ones(3)
    clip_grad_norm_([a], max_norm=0.0)  # <= 0 disables clipping
    assert torch.equal(a.grad, torch.ones(3))


def test_clip_grad_norm_is_exact_on_large_and_sharded_gradients():
    """A 0.5M-element gradient (the debug model's output head): CPU's fp32 norm kernel is 2e-5 off there, which
    would break the 1e-5 parity between layouts; the row-wise norms with an fp64 sum stay at fp32 rounding, for
    the whole tensor and for it cut into row or column shards as FSDP and TP cut it."""
    g = torch.randn(2048, 256, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 256)
    exact = g.double().square().sum().sqrt().item()
    for pieces in ([g], list(g.chunk(4, dim=0)), list(g.chunk(4, dim=1)), [g[:5], g[5:]]):
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in pieces]
        for p, t in zip(params, pieces):
            p.grad = t.clone()
        norm = clip_grad_norm_(params, max_norm=0.0).item()
        assert abs(norm - exact) <= 2e-7 * exact, (len(pieces), norm, exact)


def test_throughput_and_mfu_formulas():
    peak = PeakFlops(bf16_tflops=100.0, fp8_tflops=None, source="test", device_name="test")
    # 1000 tokens on this dp rank in 2 s, shared by tp*pp*cp = 4 devices: 125 tokens/s per device
    m = throughput_metrics(1000, 2.0, 4, dp_ranks_rate_sum=1000.0, flops_per_token=8e9, peak=peak)
    assert m["throughput/tokens_per_sec_per_device"] == 125.0
    assert m["throughput/tokens_per_sec_global"] == 1000.0
    assert m["throughput/tflops_per_device"] == pytest.approx(8e9 * 125 / 1e12)
    assert m["mfu/percent"] == pytest.approx(100 * 1.0 / 100.0)
