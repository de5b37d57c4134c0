"""Where metric dicts go: TensorBoard event files, a JSON-lines file, and one aligned stdout line per log step.

Every sink takes the same `{tag: number}` dict, with the tag names unchanged, so a number has one name
everywhere (TensorBoard, metrics.jsonl, docs/metrics.md).

Resuming: a run that crashed at step 10 and resumes from the step-5 checkpoint redoes steps 6..10. Both
file sinks take `purge_step` (the first step the resumed run will log) so the stale points from the crashed
run are dropped instead of shown twice.
"""

import json
import math
import os
import re
from pathlib import Path

from torchtitan.errors import UserError


class TensorBoardSink:
    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None):
        # Imported here: tensorboard is heavy and only the logging rank needs it.
        from torch.utils.tensorboard import SummaryWriter

        # purge_step makes the writer emit a SessionLog.START at that step; TensorBoard's reader then hides
        # every older event with step >= purge_step.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, float(value), global_step=step)
        # Flush every log step: the default waits up to 2 minutes, which hides a live run and loses the
        # last points on a crash. Log steps are rare enough that this costs nothing.
        self.writer.flush()

    def write_text(self, tag: str, text: str, step: int = 0) -> None:
        """Plain text (run header, config). Shown verbatim: TensorBoard renders markdown, so the text is
        indented into a code block. TensorBoard stores it under the tag `<tag>/text_summary`."""
        block = "\n".join("    " + line for line in text.splitlines())
        self.writer.add_text(tag, block, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _json_value(value):
    """Numbers as JSON numbers; NaN/inf become null, because NaN/Infinity are not JSON and break strict readers
    (jq, JavaScript, pandas keeps a float column with NaN for null). A diverged run is visible either way."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    value = float(value)  # also 0-d tensors and numpy scalars
    return value if math.isfinite(value) else None


def _line_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


class JsonlSink:
    """Appends `{"step": step, **metrics}` as one JSON object per line, flushed as it is written."""

    def __init__(self, path: str | os.PathLike, purge_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._clean(purge_step)
        self._f = open(self.path, "a", encoding="utf-8")

    def _clean(self, purge_step: int | None) -> None:
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        # A crash in the middle of a write leaves an unterminated last line; appending to it would
        # corrupt the next record too.
        keep = [ln for ln in lines if ln.endswith("\n")]
        if purge_step is not None:
            keep = [ln for ln in keep if (s := _line_step(ln)) is not None and s < purge_step]
        if len(keep) != len(lines):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(keep), encoding="utf-8")
            os.replace(tmp, self.path)  # atomic: a crash now leaves either the old or the new file

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": int(step)}
        record.update({k: _json_value(v) for k, v in metrics.items()})
        self._f.write(json.dumps(record, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# [[fill]align][sign][z][#][0][width]... of Python's format-spec mini-language: we need the width.
_WIDTH = re.compile(r"^(?:.?[<>=^])?[+\- ]?z?#?0?(\d+)")


def _format_value(value, spec: str) -> str:
    try:
        if spec.endswith(("d", "n")) and isinstance(value, float) and value.is_integer():
            value = int(value)  # counts often arrive as floats; "d" rejects floats
        return format(value, spec)
    except (ValueError, TypeError):
        # A log line must never crash a training run: fall back to a generic format, same width.
        m = _WIDTH.match(spec)
        return f"{value!s:>{m.group(1) if m else ''}}"


def format_line(
    step: int, metrics: dict[str, float], fields: list[tuple[str, str, str]], step_width: int = 6
) -> str:
    """One stdout line: `step      5  loss  7.1234  tps   12,345 ...`.

    fields: (metric key, short label, format spec). Columns line up across steps because every value is
    padded to the width in its spec ("8.4f", ">9,.0f", "6.2%"): give every spec a width. Fields whose key is
    absent from `metrics` are left out of the line (e.g. FP8 MFU in a bf16 run); lines with the same keys
    present always align.
    """
    parts = [f"step {step:>{step_width}d}"]
    for key, label, spec in fields:
        if key in metrics and metrics[key] is not None:
            parts.append(f"{label} {_format_value(metrics[key], spec)}")
    return "  ".join(parts)


def read_tensorboard_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files directly under `log_dir`, read with TensorBoard's own reader (which
    applies purge_step exactly as the TensorBoard UI does): {tag: [(step, value), ...]} in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not Path(log_dir).is_dir():
        raise UserError(f"TensorBoard log dir {str(log_dir)!r} does not exist or is not a directory")
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
