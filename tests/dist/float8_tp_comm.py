"""float8 tensorwise + TP 2 + sequence parallel on the whole debug-flavor model (2 ranks, gloo): what the
sequence-parallel collectives carry, and that the sharded model matches the same float8 model unsharded.

    torchrun --nproc_per_node 2 tests/dist/float8_tp_comm.py [tensorwise|rowwise] [steps]

Gloo cannot carry float8 dtypes, so apply_tp keeps plain styles there; this script forces the float8 styles
and lets gloo all-gather torchao's float8 payload as its raw bytes (uint8 view, the same bytes: numerics
unchanged), which is what NCCL moves. `steps` AdamW steps of the TP model and of the same float8 model
unsharded, same tokens; the first step's forward and backward run under a CommDebugMode that also records each
collective's payload dtype (the local tensor's; for torchao's Float8TrainingTensor, its raw float8 data).
Prints on rank 0 'OK <recipe> <worst loss rel diff> {collective: {payload dtype: count}}'; a mismatch raises.
"""

import json
import sys
from collections import Counter

import torch
import torch.distributed as dist
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

from torchtitan.config import JobConfig
from torchtitan.models.llama3.args import llama3_flavors
from torchtitan.models.llama3.model import Transformer
from torchtitan.parallel.tensor import apply_tp
from torchtitan.quantize.cpu_float8 import use_fp32_scaled_mm_on_cpu
from torchtitan.quantize.float8 import convert_to_float8

COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


class PayloadMode(CommDebugMode):
    """CommDebugMode that also counts (collective, payload dtype)."""

    def __init__(self):
        super().__init__()
        self.payload = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in COLLECTIVES and isinstance(args[0], torch.Tensor):
            data = getattr(args[0], "_data", args[0])  # Float8TrainingTensor keeps its float8 bytes in _data
            self.payload[(name, str(data.dtype).removeprefix("torch."))] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def gloo_float8_as_bytes():
    """Let gloo all-gather a Float8TrainingTensor: torchao's handler passes its float8 data to the collective,
    which gloo rejects; pass the same bytes as uint8 and view the result back."""
    from torchao.float8 import float8_ops
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    table = float8_ops.FLOAT8_OPS_TABLE
    for op in [op for op in table if "all_gather_into_tensor" in str(op)]:

        def as_bytes(aten_op, args, kwargs=None):
            t = args[0]
            out = aten_op(t._data.contiguous().view(torch.uint8), *args[1:], **(kwargs or {}))
            return Float8TrainingTensor(
                out.view(t._data.dtype), t._scale, t._orig_dtype, t._linear_mm_config, t._gemm_input_role
            )

        table[op] = as_bytes


def main():
    recipe = sys.argv[1] if len(sys.argv) > 1 else "tensorwise"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    dist.init_process_group("gloo")
    use_fp32_scaled_mm_on_cpu()  # as parallelize() does for float8 on a CPU
    mesh = init_device_mesh("cpu", (2,))
    cfg = JobConfig()
    cfg.float8.enable, cfg.float8.recipe, cfg.float8.min_dim = True, recipe, 16
    args = llama3_flavors["debugmodel"]
    ref = Transformer(args)
    ref.init_weights(seed=0)
    tp = Transformer(args)
    tp.load_state_dict(ref.state_dict())
    convert_to_float8(ref, cfg)
    convert_to_float8(tp, cfg)  # before TP, as parallelize() does
    gloo_float8_as_bytes()
    apply_tp(tp, mesh, sequence_parallel=True, loss_parallel=False, float8_styles=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (ref, tp)]

    def step(model, opt, tokens):
        logits = model(tokens[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for i in range(steps):
        tokens = torch.randint(0, args.vocab_size, (2, 65), generator=gen)
        loss_ref = step(ref, opts[0], tokens)
        if i == 0:
            with PayloadMode() as mode:
                loss = step(tp, opts[1], tokens)
        else:
            loss = step(tp, opts[1], tokens)
        worst = max(worst, abs(loss - loss_ref) / loss_ref)
        if dist.get_rank() == 0:
            print(f"step {i + 1}: loss {loss_ref:.6f} (1 process) {loss:.6f} (TP 2)", flush=True)
    # Same float8 casts (tensorwise amaxes are taken over the whole DTensor, i.e. all-reduced across ranks);
    # only fp32 summation orders differ, and AdamW carries them on.
    assert worst <= 1e-4, worst
    by_op: dict[str, dict[str, int]] = {}
    for (name, dtype), n in sorted(mode.payload.items()):
        by_op.setdefault(name, {})[dtype] = n
    counts = mode.get_comm_counts()
    for name, dtypes in by_op.items():  # the two views of the same collectives agree
        assert sum(dtypes.values()) == sum(n for op, n in counts.items() if name in str(op)), (by_op, counts)
    if dist.get_rank() == 0:
        print("OK", recipe, f"{worst:.2e}", json.dumps(by_op), flush=True)
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)


if __name__ == "__main__":
    main()
