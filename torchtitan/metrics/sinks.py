"""Where metric dicts go: TensorBoard event files, a JSON-lines file, and one aligned stdout line per log step.

Every sink takes the same `{tag: number}` dict, with the tag names unchanged, so a number has one name
everywhere (TensorBoard, metrics.jsonl, docs/metrics.md).

Resuming: a run that crashed at step 10 and resumes from the step-5 checkpoint redoes steps 6..10. Both
file sinks take `purge_step` (the first step the resumed run will log) so the stale points from the crashed
run are dropped instead of shown twice.
"""

import contextlib
import errno
import json
import math
import os
import re
import uuid
import warnings
from pathlib import Path

from torchtitan.errors import UserError
from torchtitan.log import logger


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


class WandbSink:
    """Weights & Biases, next to TensorBoard: the same tags at the same steps (wandb is an optional dependency).

    One W&B run per job (per job and rank with metrics.wandb_every_rank, grouped under the job's run id). The id
    is kept in <dump_folder>/wandb/run_id, so a resumed job continues its run: W&B's rewind (`resume_from`
    "<id>?_step=<resumed step>") drops what the crashed part logged after the checkpoint, as TensorBoard's
    purge_step does, and the steps continue without a point twice. WANDB_MODE=offline writes the run under
    <dump_folder>/wandb/ for a later `wandb sync`.
    """

    ID_FILE = "wandb/run_id"

    def __init__(
        self,
        dump_folder: str | os.PathLike,
        project: str,
        run_id: str,
        resume_step: int | None,
        config: dict,
        rank: int | None = None,
    ):
        wandb = import_wandb()
        run_name = Path(os.path.abspath(dump_folder)).name
        kwargs = dict(
            project=project,
            dir=str(dump_folder),
            config=config,
            # our own console lines stay ours: W&B does not wrap stdout/stderr
            settings=wandb.Settings(console="off", quiet=True),
        )
        if rank is not None:  # every rank logs: one run per rank, grouped by the job's id
            kwargs.update(group=run_id, name=f"{run_name}-rank{rank}")
            run_id = f"{run_id}-rank{rank}"
        else:
            kwargs.update(name=run_name)
        if resume_step:
            try:
                self.run = wandb.init(id=run_id, resume_from=f"{run_id}?_step={resume_step}", **kwargs)
                return
            except Exception as e:  # rewind needs server support; continue the run without it
                warnings.warn(
                    f"W&B could not rewind run {run_id} to step {resume_step} ({e}); resuming it instead:"
                    " points the crashed run logged after that step may be kept by W&B",
                    stacklevel=2,
                )
        self.run = wandb.init(id=run_id, resume="allow", **kwargs)

    @classmethod
    def run_id(cls, dump_folder: str | os.PathLike, resuming: bool) -> str:
        """The job's W&B run id: the saved one when resuming, else a new one (saved). Rank 0 only."""
        path = Path(dump_folder) / cls.ID_FILE
        if resuming and path.is_file():
            saved = path.read_text(encoding="utf-8").strip()
            if saved:
                return saved
        path.parent.mkdir(parents=True, exist_ok=True)
        new = uuid.uuid4().hex[:12]  # W&B run ids: letters and digits
        path.write_text(new + "\n", encoding="utf-8")
        return new

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def write_text(self, tag: str, text: str) -> None:
        self.run.notes = text if tag == "run/header" else f"{self.run.notes or ''}\n{text}"

    def close(self) -> None:
        self.run.finish()


def import_wandb():
    try:
        import wandb
    except ImportError:
        raise UserError(
            "metrics.enable_wandb=true needs the wandb package: pip install wandb (it is in the dev extras),"
            " or set metrics.enable_wandb=false"
        ) from None
    return wandb


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
    """Appends `{"step": step, **metrics}` as one JSON object per line, flushed as it is written.

    Several writes for the same step (training metrics, then validation) end up in ONE line: the step's line is
    rewritten with the union of the metrics, so readers see one object per step.
    """

    def __init__(self, path: str | os.PathLike, purge_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._clean(purge_step)
        self._f = open(self.path, "ab", buffering=0)  # unbuffered: a failed write leaves nothing to retry
        self._last: tuple[int, int, dict] | None = None  # (step, offset of its line, its record)
        self._failed = False  # a write failed (said once)

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
        if self._last is not None and self._last[0] == step:
            record, offset = self._last[2], self._last[1]
            self._f.truncate(offset)  # append mode: the merged line is then written at the new end
        else:
            offset = self._f.seek(0, os.SEEK_END)  # the end (tell() may be past it after a failed write)
        record.update({k: _json_value(v) for k, v in metrics.items()})
        line = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        try:
            if self._f.write(line) != len(line):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:
            # A full disk or an I/O error must not stop training over its metrics file: this line is dropped (the
            # console and TensorBoard still have it), without a partial line, and said once. A checkpoint that
            # fails on the same disk is reported by the checkpoint, with its advice.
            with contextlib.suppress(OSError):
                self._f.truncate(offset)
            if not self._failed:
                logger.warning(
                    f"metrics: cannot write {self.path} ({e.strerror or e}); its lines are dropped"
                )
            self._failed, self._last = True, None
            return
        self._last = (int(step), offset, record)

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
