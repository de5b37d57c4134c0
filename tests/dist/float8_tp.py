"""float8 + tensor parallel on 2 ranks: a SwiGLU MLP (plus a linear the filter skips) converted to float8
BEFORE TP and sharded with the styles float8_tp_style picks, against the same float8 MLP unsharded.

    torchrun --nproc_per_node 2 tests/dist/float8_tp.py
Prints 'OK <max output diff> <max grad diff>' on rank 0; any mismatch raises.
"""

import torch
import torch.distributed as dist
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import parallelize_module

from torchtitan.config import JobConfig
from torchtitan.models.llama3.model import FeedForward
from torchtitan.quantize.cpu_float8 import use_fp32_scaled_mm_on_cpu
from torchtitan.quantize.float8 import convert_to_float8, float8_tp_style


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.feed_forward = FeedForward(64, 192)
        self.small = nn.Linear(64, 32, bias=False)  # below min_dim: stays nn.Linear

    def forward(self, x):
        return self.feed_forward(x).sum(-1) + self.small(x).sum(-1)


def main():
    dist.init_process_group("gloo")
    use_fp32_scaled_mm_on_cpu()  # as parallelize() does for float8 on a CPU
    mesh = init_device_mesh("cpu", (2,))
    cfg = JobConfig()
    cfg.float8.enable, cfg.float8.min_dim = True, 48
    torch.manual_seed(0)
    ref, tp = Net(), Net()
    tp.load_state_dict(ref.state_dict())
    convert_to_float8(ref, cfg)
    convert_to_float8(tp, cfg)
    ff = tp.feed_forward
    plan = {
        "feed_forward.w1": float8_tp_style(ff.w1, "colwise"),
        "feed_forward.w3": float8_tp_style(ff.w3, "colwise"),
        "feed_forward.w2": float8_tp_style(ff.w2, "rowwise"),
        "small": float8_tp_style(tp.small, "colwise", output_layouts=Replicate()),  # kwargs pass through
    }
    assert type(plan["feed_forward.w1"]).__name__ == "Float8ColwiseParallel"
    assert type(plan["feed_forward.w2"]).__name__ == "Float8RowwiseParallel"
    assert type(plan["small"]).__name__ == "ColwiseParallel"
    parallelize_module(tp, mesh, plan)
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(1))
    y_ref, y = ref(x), tp(x)
    y_ref.sum().backward()
    y.sum().backward()
    out_diff = (y - y_ref).abs().max().item()
    grad_diff = 0.0
    for p_ref, p in zip(ref.parameters(), tp.parameters()):
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grad_diff = max(grad_diff, ((g - p_ref.grad).abs().max() / p_ref.grad.abs().max()).item())
    # Same float8 casts (tensorwise scales are global amaxes, all-reduced under TP), only the summation order of
    # the row-wise partial sums differs: fp32 rounding, nothing more.
    assert out_diff <= 1e-5 * y_ref.abs().max().item(), out_diff
    assert grad_diff <= 1e-5, grad_diff
    if dist.get_rank() == 0:
        print("OK", out_diff, grad_diff)
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)


if __name__ == "__main__":
    main()
