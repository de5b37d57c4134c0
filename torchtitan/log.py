"""Rank-prefixed logging: every rank logs to its own file; LOG_RANK decides which ranks also print to the console."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("torchtitan")


def init_logger(rank: int, log_dir: str | None = None, stream=None) -> None:
    """Console for the ranks listed in LOG_RANK (comma-separated, default "0"; "all" = every rank), file for all.

    The console is stdout unless `stream` says otherwise (generation keeps stdout for the generated text)."""
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    wanted = os.environ.get("LOG_RANK", "0").strip()
    if wanted == "all" or str(rank) in {r.strip() for r in wanted.split(",")}:
        console = logging.StreamHandler(stream or sys.stdout)
        console.setFormatter(fmt)
        logger.addHandler(console)
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
        file = logging.FileHandler(os.path.join(log_dir, f"rank{rank}.log"))
        file.setFormatter(fmt)
        logger.addHandler(file)
