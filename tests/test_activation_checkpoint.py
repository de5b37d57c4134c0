"""Activation checkpointing: which blocks are wrapped, what selective per-op AC saves, unchanged state-dict
names, and bitwise-equal training (the recompute must not change a single bit)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_parity import layout_rows
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import FIXED_PEAK, TINY, import_script
from torchtitan.models.llama3.args import ModelArgs
from torchtitan.models.llama3.model import Transformer
from torchtitan.parallel.activation_checkpoint import SAVE_OPS, apply_ac

ARGS = ModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=128, multiple_of=32, max_seq_len=32)


def _model(mode: str = "none", option: str = "op") -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ARGS)
    model.init_weights(seed=0)
    return apply_ac(model, mode, option)


def _is_wrapped(block) -> bool:
    return hasattr(block, "_checkpoint_wrapped_module")


@pytest.mark.parametrize(
    "mode,option,wrapped",
    [
        ("none", "op", []),
        ("full", "op", ["0", "1", "2", "3"]),
        ("selective", "op", ["0", "1", "2", "3"]),
        ("selective", "2", ["1", "3"]),
        ("selective", "3", ["2"]),
        ("selective", "1", ["0", "1", "2", "3"]),
    ],
)
def test_which_blocks_are_wrapped(mode, option, wrapped):
    model = _model(mode, option)
    assert [k for k, b in model.layers.items() if _is_wrapped(b)] == wrapped
    assert list(model.layers.keys()) == ["0", "1", "2", "3"]  # keys (FQNs) kept, order kept


@pytest.mark.parametrize("mode,option", [("full", "op"), ("selective", "2"), ("selective", "op")])
def test_state_dict_names_and_init_unchanged(mode, option):
    """DCP checkpoints and layout-independent init both rely on the wrapper being invisible in names/values."""
    plain, wrapped = _model(), _model(mode, option)
    sd_plain, sd_wrapped = plain.state_dict(), wrapped.state_dict()
    assert list(sd_wrapped) == list(sd_plain)
    for k in sd_plain:
        assert torch.equal(sd_plain[k], sd_wrapped[k]), k  # init normalized the wrapper infix away
    # ... and a plain checkpoint loads into the wrapped model (strict) and vice versa.
    wrapped.load_state_dict(sd_plain)
    plain.load_state_dict(sd_wrapped)
    # Module.compile() (how apply_compile compiles) does not rename anything either.
    for block in wrapped.layers.values():
        block.compile()
    assert list(wrapped.state_dict()) == list(sd_plain)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _op_counts(mode: str, option: str = "op") -> tuple[Counter, torch.Tensor, list[torch.Tensor]]:
    model = _model(mode, option)
    tokens = torch.randint(0, ARGS.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with _CountOps() as counter:
        loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
    return counter.counts, loss.detach(), [p.grad for p in model.parameters()]


def test_selective_op_saves_every_other_matmul_and_recomputes_cheap_ops():
    base, loss0, grads0 = _op_counts("none")
    full, loss1, grads1 = _op_counts("full")
    sel, loss2, grads2 = _op_counts("selective", "op")
    assert torch.ops.aten.mm.default in SAVE_OPS
    # full AC re-runs every block forward in backward -- up to the last tensor backward needs: torch's
    # non-reentrant checkpoint stops early, so w2 (whose output no backward formula reads) is not re-run.
    # 6 of the 7 linears per block, and attention again.
    assert full["mm"] == base["mm"] + 6 * ARGS.n_layers
    assert (
        full["_scaled_dot_product_flash_attention_for_cpu"]
        == 2 * base["_scaled_dot_product_flash_attention_for_cpu"]
    )
    # per-op AC keeps attention and every odd matmul (wq, wv, w1, w2 of a block) and re-runs the even ones
    # (wk, wo, w3): 3 extra matmuls per block, no extra attention call ...
    assert sel["mm"] == base["mm"] + 3 * ARGS.n_layers
    assert (
        sel["_scaled_dot_product_flash_attention_for_cpu"]
        == base["_scaled_dot_product_flash_attention_for_cpu"]
    )
    # ... but recomputes the elementwise ops (SiLU of the SwiGLU, once per block)
    assert sel["silu"] == base["silu"] + ARGS.n_layers
    # and the numbers are identical bit for bit
    for loss, grads in ((loss1, grads1), (loss2, grads2)):
        assert torch.equal(loss, loss0)
        assert all(torch.equal(a, b) for a, b in zip(grads, grads0))


def test_ac_modes_train_bitwise_equal(monkeypatch, tmp_path):
    """10 fp32 training steps: none vs full, selective every 2nd block and selective per-op give identical
    losses and grad norms (rtol 0): recomputation replays the same kernels on the same inputs.
    Trained as loss_compare trains (its defaults), the four runs in one process (test_parity.layout_rows), so
    the baseline is trained once, not once per pair."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    lc = import_script("loss_compare")
    modes = {
        "full": ["--activation_checkpoint.mode=full"],
        "2": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=2"],
        "op": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"],
    }
    runs = {"none": (1, []), **{name: (1, args) for name, args in modes.items()}}
    trained = layout_rows(runs, tmp_path, [*TINY, FIXED_PEAK, "--training.steps=10"])
    baseline = trained["none"]
    for name in modes:
        rows = trained[name]
        lines, worst = lc.compare(baseline, rows, rtol=0.0)
        assert len(rows) == 10
        assert worst == {"loss/global_avg": 0.0, "grad_norm": 0.0}, "\n".join(lines)
