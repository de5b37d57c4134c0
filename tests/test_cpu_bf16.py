"""bf16 through fp32 kernels on CPUs without bf16 instructions (torchtitan/parallel/cpu_bf16.py).

The kernels are exercised directly, whatever this CPU has: they must keep the bf16 contract (operands and results
rounded to bf16, fp32 sums), so they agree with torch's bf16 kernels to within the rounding of the result, and
they must not be plain fp32. `fp32_kernels_apply` decides where the trainer uses them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import FIXED_PEAK, TINY, losses, train_together
from torchtitan.metrics import hardware
from torchtitan.models.llama3 import ModelArgs, Transformer
from torchtitan.parallel import cpu_bf16
from torchtitan.parallel.cpu_bf16 import (
    ONEDNN_MIN_WEIGHT,
    Fp32KernelLinear,
    apply_cpu_bf16_kernels,
    few_rows_kernel,
    fp32_kernels_apply,
    matmul_dtype,
    use_cpu_bf16_kernels,
)

BF16 = torch.bfloat16


def within_bf16_rounding(ours: torch.Tensor, ref: torch.Tensor, ulps: int = 1) -> None:
    """Each element within `ulps` bf16 units in the last place of the larger of the two (2^-7 relative per ulp:
    bf16 keeps 8 significant bits), plus a floor for values that are sums cancelling to near zero."""
    ours, ref = ours.float(), ref.float()
    floor = 1e-6 * ref.abs().max().item()
    bound = ulps * 2.0**-7 * torch.maximum(ours.abs(), ref.abs()) + floor
    worst = ((ours - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"differs by {worst:.2f} x {ulps} bf16 ulp(s)"


def grads(fn, *inputs):
    """Output of fn(*inputs) and the gradients of sum(output * fixed weights) for every input (for a DTensor
    output, the same weights laid out as the output)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    if isinstance(out, DTensor):
        weights = distribute_tensor(weights, out.device_mesh, out.placements)
    (out.float() * weights).sum().backward()
    return out, [t.grad for t in leaves]


@pytest.fixture
def operands():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 16, 64, generator=g), torch.randn(48, 64, generator=g)  # x [B, S, K], w [N, K]


def test_linear_under_autocast_is_bf16_arithmetic_in_fp32_kernels(operands):
    """fp32 parameters and activations under autocast (one data-parallel rank)."""
    x, w = operands
    with torch.autocast("cpu", BF16):
        ours, (gx, gw) = grads(cpu_bf16.linear, x, w)
        ref, (rx, rw) = grads(F.linear, x, w)  # torch's bf16 kernel
    assert ours.dtype == BF16 and gx.dtype == torch.float32 and gw.dtype == torch.float32
    # by definition: the operands rounded to bf16, fp32 products and sums, the result rounded to bf16
    assert torch.equal(ours, F.linear(x.to(BF16).float(), w.to(BF16).float()).to(BF16))
    assert not torch.equal(ours.float(), F.linear(x, w))  # not fp32 compute
    within_bf16_rounding(ours, ref)
    within_bf16_rounding(gx, rx)
    within_bf16_rounding(gw, rw)
    # the gradients are bf16 values (rounded as in a bf16 backward), stored in the parameters' fp32
    assert torch.equal(gw, gw.to(BF16).float()) and torch.equal(gx, gx.to(BF16).float())


def test_linear_on_bf16_parameters(operands):
    """bf16 parameters and activations, no autocast (FSDP's bf16 all-gathered parameters)."""
    x, w = (t.to(BF16) for t in operands)
    ours, (gx, gw) = grads(cpu_bf16.linear, x, w)
    ref, (rx, rw) = grads(F.linear, x, w)
    assert ours.dtype == gx.dtype == gw.dtype == BF16
    within_bf16_rounding(ours, ref)
    within_bf16_rounding(gx, rx)
    within_bf16_rounding(gw, rw)


def test_fp32_compute_and_bias_take_torch_kernels(operands):
    x, w = operands
    out = cpu_bf16.linear(x.requires_grad_(), w)
    assert torch.equal(out, F.linear(x, w)) and "LinearInFp32" not in type(out.grad_fn).__name__
    bias = torch.randn(48)
    with torch.autocast("cpu", BF16):
        out = cpu_bf16.linear(x, w, bias)
        assert torch.equal(out, F.linear(x, w, bias))


def test_dtensor_operands_take_them(operands):
    """Tensor parallel: DTensor operands (a column-wise weight, a replicated input, on a one-rank gloo mesh) take
    the fp32 kernels on their local tensors -- the same values and gradients as plain tensors -- and the output
    and gradients keep DTensor's own placements."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    x, w = (t.to(BF16) for t in operands)
    plain, (px, pw) = grads(cpu_bf16.linear, x, w)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        dx, dw = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w, mesh, [Shard(0)])
        assert cpu_bf16._applies(dx, dw)
        out, (gx, gw) = grads(cpu_bf16.linear, dx, dw)
        assert "LinearInFp32" in type(out.grad_fn).__name__
        assert all(isinstance(t, DTensor) for t in (out, gx, gw))
        assert out.placements == (Shard(2),) and gw.placements == (Shard(0),)
        assert torch.equal(out.full_tensor(), plain)
        assert torch.equal(gx.full_tensor(), px) and torch.equal(gw.full_tensor(), pw)
    finally:
        dist.destroy_process_group()


def test_few_rows_without_autograd_take_the_kernel_that_streams_the_weight():
    """Generation's decode steps: oneDNN's bf16 matmul for large weights, torch's bf16 kernel for small ones (its
    call overhead is lower), the fp32 kernel from 64 rows on and whenever autograd records."""
    big, small = torch.empty(ONEDNN_MIN_WEIGHT // 64, 64), torch.empty(48, 64)
    decode, prefill = torch.empty(8, 1, 64), torch.empty(2, 32, 64)
    assert few_rows_kernel(decode, big) == ("onednn" if cpu_bf16._ONEDNN else "torch")
    assert few_rows_kernel(decode, small) == "torch"
    assert few_rows_kernel(prefill, big) is None and few_rows_kernel(prefill, small) is None


@pytest.mark.skipif(not cpu_bf16._ONEDNN, reason="this torch build has no oneDNN")
def test_onednn_kernel_keeps_the_bf16_contract():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 2048, generator=g).to(BF16)[:, -1:]  # the last position of each row: a strided view
    w = torch.randn(ONEDNN_MIN_WEIGHT // 2048, 2048, generator=g).to(BF16)
    with torch.no_grad():
        ours, ref = cpu_bf16.linear(x, w), F.linear(x, w)
    exact = F.linear(x.float(), w.float())
    assert ours.dtype == BF16 and ours.shape == ref.shape == (3, 1, w.shape[0])
    assert torch.equal(ours, torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, None, "none", [], ""))
    # where torch's own bf16 kernel is not oneDNN's (on CPUs with bf16 instructions it is)
    if hardware.cpu_lacks_bf16_instructions():
        assert not torch.equal(ours, ref)  # a different kernel (so the check above tells which one ran) ...
    within_bf16_rounding(ours, ref)  # ... with the same contract: fp32 sums of bf16 products, rounded to bf16
    within_bf16_rounding(ours, exact)
    assert not torch.equal(ours.float(), exact)
    # autograd recording: the fp32 kernel, which has a backward
    out = cpu_bf16.linear(x, w.clone().requires_grad_())
    assert "LinearInFp32" in type(out.grad_fn).__name__
    # compiled (generate --compile): the same numbers, through an op Inductor leaves alone
    compiled = torch.compile(cpu_bf16.linear, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x, w), ours)


def test_attention_is_as_close_to_exact_as_torch_bf16_kernel():
    """Attention sums over keys with weights in [0, 1], so its rounding errors scale with the largest value, not
    with each element: both bf16 kernels stay within one bf16 ulp of the largest value of fp32 attention on the
    same bf16 inputs (torch's kernel also rounds the softmax probabilities to bf16; ours keeps them fp32)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 32, 16, generator=g).to(BF16)
    k, v = (torch.randn(2, 2, 32, 16, generator=g).to(BF16) for _ in range(2))

    def run(fn, *qkv):
        return grads(lambda q, k, v: fn(q, k, v, is_causal=True, enable_gqa=True), *qkv)

    ours = run(cpu_bf16.scaled_dot_product_attention, q, k, v)
    torch_bf16 = run(F.scaled_dot_product_attention, q, k, v)
    exact = run(F.scaled_dot_product_attention, q.float(), k.float(), v.float())
    assert ours[0].dtype == BF16 and all(t.dtype == BF16 for t in ours[1])
    for kernel in (ours, torch_bf16):
        for got, want in zip([kernel[0], *kernel[1]], [exact[0], *exact[1]]):
            scale = want.abs().max().item()
            assert (got.float() - want).abs().max().item() <= 2.0**-7 * scale


def tiny_model(tie: bool) -> Transformer:
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=32)
    args.tie_embeddings = tie
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights(0)
    return model


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_model_keeps_its_parameters_and_its_bf16_logits(tie):
    native = tiny_model(tie)
    model = copy.deepcopy(native)
    swapped = apply_cpu_bf16_kernels(model)
    assert swapped == 2 * 7 + (0 if tie else 1)  # 7 per block, and the untied output
    assert not [m for m in model.modules() if type(m) is nn.Linear]
    assert all(isinstance(m, Fp32KernelLinear) for m in model.modules() if isinstance(m, nn.Linear))
    assert model.state_dict().keys() == native.state_dict().keys()
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", BF16):
        ours, ref = model(tokens), native(tokens)
    with torch.no_grad():
        fp32 = native(tokens)
    # the two bf16 kernels' logits differ by the rounding of two layers; neither is the fp32 result
    assert ours.dtype == BF16
    assert (ours.float() - ref.float()).abs().max().item() < 0.05 * ref.float().abs().max().item()
    loss = F.cross_entropy(ours.float().flatten(0, 1), tokens.flatten())
    loss_ref = F.cross_entropy(ref.float().flatten(0, 1), tokens.flatten())
    assert loss.item() == pytest.approx(loss_ref.item(), rel=2e-3)
    assert not torch.equal(ours.float(), fp32)
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_where_the_trainer_uses_them(monkeypatch):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert fp32_kernels_apply("cpu", BF16) and matmul_dtype("cpu", BF16) == torch.float32
    assert (
        not fp32_kernels_apply("cpu", BF16, enabled=False)
        and matmul_dtype("cpu", BF16, enabled=False) == BF16
    )
    assert matmul_dtype("cuda", BF16) == BF16 and matmul_dtype("cpu", torch.float32) == torch.float32
    assert not fp32_kernels_apply("cpu", torch.float32)
    assert not fp32_kernels_apply("cuda", BF16)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # native bf16 instructions
    assert not fp32_kernels_apply("cpu", BF16)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")  # capability not reported
    assert not fp32_kernels_apply("cpu", BF16)


@pytest.mark.skipif(not fp32_kernels_apply("cpu", BF16), reason="this CPU has bf16 instructions")
@pytest.mark.parametrize(
    "nproc,layout",
    [(1, []), (2, ["--parallelism.tensor_parallel_degree=2", FIXED_PEAK])],
    ids=["one_process", "tp2"],
)
def test_trainer_losses_with_and_without_them(tmp_path, nproc, layout):
    """bf16, in one process (autocast) and on TP 2 (DTensor operands): the first steps' losses with torch's bf16
    kernels and with the fp32 ones agree to bf16 rounding (the runs start from the same weights and data; both
    train in the same processes, one after the other)."""
    runs = {
        on: [
            *TINY,
            *layout,
            "--training.steps=3",
            "--metrics.enable_jsonl=true",
            f"--training.cpu_bf16_fp32_kernels={on}",
        ]
        for on in ("true", "false")
    }
    folders = train_together(nproc, runs, tmp_path)
    ours, torchs = losses(folders["true"]), losses(folders["false"])
    assert sorted(ours) == [1, 2, 3] and sorted(torchs) == [1, 2, 3]
    assert [ours[s] for s in (1, 2, 3)] == pytest.approx([torchs[s] for s in (1, 2, 3)], rel=2e-3)


def test_generation_uses_them_where_training_does(monkeypatch):
    """scripts/generate.py's loader: the same rule as the trainer; the tied head's logits of a decode step stay
    within bf16 rounding of torch's kernels; torchao's quantized weights keep torchao's kernels."""
    from torchtitan.generate.loader import quantize_weights

    monkeypatch.setattr(hardware, "cpu_lacks_bf16_instructions", lambda: True)
    monkeypatch.setattr(cpu_bf16, "cpu_lacks_bf16_instructions", lambda: True)
    args = ModelArgs(
        dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=ONEDNN_MIN_WEIGHT // 64, max_seq_len=16
    )
    args.tie_embeddings = True
    torch.manual_seed(0)
    native = Transformer(args)
    native.init_weights(0)
    native = native.to(BF16).eval().requires_grad_(False)
    model = copy.deepcopy(native)
    assert not use_cpu_bf16_kernels(model, "cpu", torch.float32, enabled=True)
    assert not use_cpu_bf16_kernels(model, "cpu", BF16, enabled=False)
    assert not use_cpu_bf16_kernels(model, "cuda", BF16, enabled=True)
    assert type(model.layers["0"].attention.wq) is nn.Linear and model.tied_linear is None
    assert use_cpu_bf16_kernels(model, "cpu", BF16, enabled=True)
    assert model.tied_linear is cpu_bf16.linear and isinstance(
        model.layers["0"].attention.wq, Fp32KernelLinear
    )
    tokens = torch.randint(0, args.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, ref = model(tokens).float(), native(tokens).float()  # 8 rows: oneDNN for the tied head
    # attention (fp32 probabilities here, bf16 in torch's kernel) and the head's sums differ in rounding only
    assert 0 < (ours - ref).abs().max().item() <= 2.0**-7 * ref.abs().max().item()
    pytest.importorskip("torchao")
    quantized = copy.deepcopy(native)
    quantize_weights(quantized, "int8")
    assert use_cpu_bf16_kernels(quantized, "cpu", BF16, enabled=True)
    with torch.no_grad():
        h = quantized.tok_embeddings(tokens)
        wq = quantized.layers["0"].attention.wq
        assert torch.equal(wq(h), F.linear(h, wq.weight))  # torchao's int8 kernel, not ours
