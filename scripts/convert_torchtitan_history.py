#!/usr/bin/env python
"""Convert every llama TOML file in a torchtitan checkout's git history, and estimate each converted one.

    python scripts/convert_torchtitan_history.py /path/to/torchtitan            # a clone with its full history

Takes each version of every `*.toml` under torchtitan's llama config folders (train_configs/ of 2024,
torchtitan/models/llama*/train_configs/ later) that a commit of the checkout's HEAD history wrote, converts it with
torchtitan/config/torchtitan_compat.py and estimates the result on H100s (8 devices, 64 for 70B files, 128 for
405B), as a user bringing that file would. Prints one line per outcome with the files' dates, then the counts;
exit 1 if a conversion or an estimate raised anything but the one-line error of a value that cannot be expressed,
2 (one line) if the folder is not a git clone.
docs/configuration.md ("Coming from torchtitan") has the result for torchtitan's history up to its last TOML files.
"""

from __future__ import annotations

import argparse
import collections
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.config import parse_args, validate  # noqa: E402
from torchtitan.config import torchtitan_compat as compat  # noqa: E402
from torchtitan.config.manager import _load_toml  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402
from torchtitan.estimate.__main__ import run  # noqa: E402

PATHS = ("train_configs/*.toml", "torchtitan/models/llama*/train_configs/*.toml")


def versions(repo: str) -> list[tuple[str, str, str]]:
    """(commit, date, path) of every version of a llama TOML file in the history."""
    log = subprocess.run(
        ["git", "-C", repo, "log", "--format=@%h %cs", "--name-only", "--diff-filter=AMR", "--", *PATHS],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    out, commit, date = [], "", ""
    for line in log.splitlines():
        if line.startswith("@"):
            commit, date = line[1:].split()
        elif line.endswith(".toml"):
            out.append((commit, date, line))
    return out


def devices(path: str) -> int:
    return 128 if "405b" in path else 64 if "70b" in path else 8


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("torchtitan", help="a git clone of pytorch/torchtitan")
    a = p.parse_args(argv)
    try:
        found = versions(a.torchtitan)
    except (subprocess.CalledProcessError, FileNotFoundError):
        print(
            f"error: {a.torchtitan} is not a git clone of pytorch/torchtitan (git log failed there)",
            file=sys.stderr,
        )
        return 2
    outcomes: dict[str, list[str]] = collections.defaultdict(list)
    crashed = False
    with tempfile.TemporaryDirectory() as tmp:
        for commit, date, path in found:
            text = subprocess.run(["git", "-C", a.torchtitan, "show", f"{commit}:{path}"],
                                  capture_output=True, text=True, check=True).stdout  # fmt: skip
            theirs, ours = Path(tmp) / "theirs.toml", Path(tmp) / "ours.toml"
            theirs.write_text(text)
            try:
                conv = compat.convert(_load_toml(str(theirs)), f"{path}@{commit}")
                ours.write_text(compat.to_toml(conv, path))
                argv = [f"--job.config_file={ours}", "--estimate.hardware=h100-sxm",
                        f"--estimate.num_devices={devices(path)}", "--estimate.accuracy=false"]  # fmt: skip
                cfg = parse_args(argv)
                validate(cfg)
                run(cfg, out=io.StringIO(), argv=argv)
                outcomes["converted and estimated"].append(date)
            except UserError as e:
                reason = re.sub(r"^\S+: ", "", str(e)).split(" cannot be expressed here: ")[0]
                outcomes[f"stopped: {reason}"].append(date)
            except Exception as e:  # noqa: BLE001  (a bug: report it, keep going)
                crashed = True
                outcomes[f"CRASH {type(e).__name__}: {e}"].append(f"{date} {path}@{commit}")
    total = sum(len(v) for v in outcomes.values())
    for what, dates in sorted(outcomes.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(dates):4d}  {what}  ({min(dates)} .. {max(dates)})")
    print(f"{total} file versions")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
