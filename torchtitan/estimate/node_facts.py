"""What this node can tell the estimator about itself: its GPUs' power limit and how NVLink joins them.

The estimator plans from a laptop, so it cannot see the cluster; two of the facts that move its figures are
properties of the node that the hardware table cannot know from the GPU's name:

  power limit   an operator's cap below the part's rated power (torchtitan's own H100s ran at 500 W of 700) slows
                every compute rate (`--estimate.power_limit_w`, "Rates" in docs/estimate.md). nvidia-smi reports
                the limit in force and the part's default (`power.limit`, `power.default_limit`).
  topology      a 4-GPU Hopper or Blackwell board has no NVSwitch: each GPU's 18 NVLinks are split among its three
                peers (`nvidia-smi topo -m` prints NV6 for every pair), where an NVSwitch node gives every pair all
                of them (NV18 for every pair; a DGX A100, whose GPUs have 12, NV12). A ring over some of a mesh's
                GPUs has only their share (`--estimate.intra_node_topology=mesh`, "Collectives").

`python -m torchtitan.preflight` prints them on the node it runs on, with the flags that carry them into a plan
(docs/launching.md, "Preflight"). The parsers take nvidia-smi's text so that they are tested on it;
nothing here changes an estimate by itself.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

# The most NVLinks a GPU has (H100 / H200 / B200 SXM: 18; A100: 12): a pair reported with k links on a node of n GPUs
# whose k x (n - 1) fits in one GPU's links has those links to itself, not through a switch.
MAX_NVLINKS_PER_GPU = 18


@dataclass(frozen=True)
class NodeFacts:
    gpus: int
    name: str
    power_limit_w: float | None  # the limit in force
    default_power_w: float | None  # the part's own
    topology: str | None  # "mesh", "switch", or None (no NVLink between every pair: PCIe, or a mix)
    links_per_pair: int | None

    def estimate_flags(self) -> list[str]:
        """The estimator options that carry these facts into a plan (only those that differ from its defaults)."""
        flags = []
        if self.power_limit_w and self.default_power_w and self.power_limit_w < self.default_power_w:
            flags.append(f"--estimate.power_limit_w={self.power_limit_w:g}")
        if self.topology == "mesh":
            flags += [f"--estimate.devices_per_node={self.gpus}", "--estimate.intra_node_topology=mesh"]
        return flags

    def describe(self) -> str:
        power = "power limit not reported"
        if self.power_limit_w:
            power = f"power limit {self.power_limit_w:g} W"
            if self.default_power_w and self.default_power_w != self.power_limit_w:
                power += f" (the part's default {self.default_power_w:g} W)"
        links = {
            "mesh": f"NVLink mesh, no switch (NV{self.links_per_pair} between each pair)",
            "switch": f"NVLink through switches (NV{self.links_per_pair} between each pair)",
            None: "one GPU" if self.gpus == 1 else "not NVLink between every pair",
        }[self.topology]
        flags = self.estimate_flags()
        plan = f"plan with {' '.join(flags)}" if flags else "the estimator's defaults describe it"
        return f"{self.gpus} x {self.name}; {power}; {links}: {plan}"


def parse_topology(text: str) -> tuple[int, str | None, int | None]:
    """(GPUs, "mesh" / "switch" / None, NVLinks a pair) from `nvidia-smi topo -m`: the matrix's GPU rows and
    columns (NIC columns and the affinity columns ignored). Every pair NVk: a mesh when k x (n - 1) fits in one GPU's
    links (MAX_NVLINKS_PER_GPU) and the node has more than two GPUs, else a switch; any pair not on NVLink: None."""
    rows: dict[str, list[str]] = {}
    header: list[str] = []
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if not header and cells[0].startswith("GPU"):
            header = cells
            continue
        if header and re.fullmatch(r"GPU\d+", cells[0]):
            rows[cells[0]] = cells[1 : 1 + len(header)]
    gpus = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    n = len(gpus)
    if n == 0 or set(gpus) - set(rows):
        return n, None, None
    links = set()
    for g in gpus:
        for col, cell in zip(header, rows[g]):
            if col in gpus and col != g:
                m = re.fullmatch(r"NV(\d+)", cell)
                if not m:
                    return n, None, None
                links.add(int(m.group(1)))
    if len(links) != 1:
        return n, None, None
    k = links.pop()
    return n, ("mesh" if n > 2 and k * (n - 1) <= MAX_NVLINKS_PER_GPU else "switch"), k


def parse_power(text: str) -> tuple[str, float | None, float | None]:
    """(name, limit in force, default limit) of the first GPU, from `nvidia-smi --query-gpu=name,power.limit,
    power.default_limit --format=csv,noheader,nounits` ("[N/A]" where the driver does not report one)."""

    def watts(cell: str) -> float | None:
        try:
            return float(cell)
        except ValueError:
            return None

    first = next((line for line in text.splitlines() if line.strip()), "")
    cells = [c.strip() for c in first.split(",")]
    if len(cells) < 3:
        return first.strip(), None, None
    return cells[0], watts(cells[1]), watts(cells[2])


def probe(run=subprocess.run) -> NodeFacts | None:
    """The facts of the node this runs on, from nvidia-smi; None where there is none (no NVIDIA GPU here: running
    it raises FileNotFoundError, an OSError) or it fails."""
    try:
        power = run(
            ["nvidia-smi", "--query-gpu=name,power.limit,power.default_limit", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        topo = run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    name, limit, default = parse_power(power)
    n, topology, k = parse_topology(topo)
    if not n:
        return None
    return NodeFacts(n, name, limit, default, topology, k)
