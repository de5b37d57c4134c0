"""The test hooks stay in one place: every TORCHTITAN_TEST_* variable is read in torchtitan/testing/faults.py only,
and each one is listed there (VARIABLES, the docstring) and in docs/testing.md. Plus what each hook does."""

from __future__ import annotations

import ast
import errno
import re
import subprocess
import sys

import pytest

from conftest import ROOT, train_env
from torchtitan.testing import faults

NAME = re.compile(r"TORCHTITAN_TEST_[A-Z0-9_]+")
FAULTS = ROOT / "torchtitan" / "testing" / "faults.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (modules, classes, functions): prose, not reads."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def names_in_code(source: str) -> list[tuple[int, str]]:
    """(line, name) of every TORCHTITAN_TEST_ name in a string of the code (f-strings included), docstrings
    excepted: reading a variable needs its name as a string, so this finds every read, however spelled. A string
    starting with TEST_ or _TEST_ (a name glued together from pieces) is reported as it is."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [(node.lineno, m) for m in NAME.findall(node.value)]
            if node.value.startswith(("TEST_", "_TEST_")):
                found.append((node.lineno, node.value))
    return sorted(found)


def production_files():
    yield ROOT / "train.py"
    for folder in ("torchtitan", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if (ROOT / "torchtitan" / "testing") not in path.parents:
                yield path


def test_the_scanner_finds_a_read_however_written():
    """The check below is only as good as names_in_code: it must see reads written in any of these ways, and
    not count a docstring that merely mentions a variable."""
    source = '''
"""Module docs may mention TORCHTITAN_TEST_DOC."""
import os
a = os.environ.get("TORCHTITAN_TEST_GET")
b = os.environ["TORCHTITAN_TEST_ITEM"]
c = os.getenv(f"TORCHTITAN_TEST_FSTRING_{a}")
d = os.environ.get("TORCHTITAN" + "_TEST_GLUED")
def f():
    """TORCHTITAN_TEST_FUNCDOC in a docstring is prose."""
    return os.environ.get("TORCHTITAN_TEST_IN_FUNC", "0")
'''
    assert names_in_code(source) == [
        (4, "TORCHTITAN_TEST_GET"),
        (5, "TORCHTITAN_TEST_ITEM"),
        (6, "TORCHTITAN_TEST_FSTRING_"),
        (7, "_TEST_GLUED"),
        (10, "TORCHTITAN_TEST_IN_FUNC"),
    ]


def test_no_test_variable_is_read_outside_torchtitan_testing():
    offenders = []
    for path in production_files():
        rel = path.relative_to(ROOT)
        offenders += [f"{rel}:{line}: {name}" for line, name in names_in_code(path.read_text())]
    assert not offenders, "test hooks belong in torchtitan/testing/faults.py:\n" + "\n".join(offenders)


def test_every_variable_is_in_the_one_documented_list():
    listed = set(faults.VARIABLES) | set(faults.HARNESS_VARIABLES)
    read = {name for _, name in names_in_code(FAULTS.read_text())}
    assert read == listed, read ^ listed  # faults.py names no other variable, and lists none it does not read
    assert set(NAME.findall(faults.__doc__)) == set(faults.VARIABLES)
    assert set(NAME.findall((ROOT / "docs" / "testing.md").read_text())) == listed
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        if path.name != "test_fault_hooks.py":  # this file plants made-up names for the scanner
            assert set(NAME.findall(path.read_text())) <= listed, (
                path,
                set(NAME.findall(path.read_text())) - listed,
            )


def test_an_unlisted_variable_cannot_be_read():
    with pytest.raises(AssertionError):
        faults._get("TORCHTITAN_TEST_NOT_LISTED")


# ---------------------------------------------------------------------------------------------- what they do


def test_hooks_do_nothing_when_unset(monkeypatch):
    for name in faults.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    batches = iter([1, 2])
    assert faults.slow_data(batches, 0) is batches
    assert faults.nan_step() == 0
    faults.hook_stall(1, 0)
    faults.never_join(0)
    faults.oom_at(1, 0)
    faults.oom_above(10**6)
    faults.before_data_file(1, 0, "/nowhere")
    faults.kill_at("step_end", 1, 0)


def test_io_error_spec_picks_step_and_rank(monkeypatch):
    monkeypatch.setenv("TORCHTITAN_TEST_IO_ERROR", "EIO:3:1")
    faults.before_data_file(3, 0, "/ck/a.distcp")  # other rank
    faults.before_data_file(2, 1, "/ck/a.distcp")  # other step
    with pytest.raises(OSError) as e:
        faults.before_data_file(3, 1, "/ck/a.distcp")
    assert e.value.errno == errno.EIO and e.value.filename == "/ck/a.distcp"
    monkeypatch.setenv("TORCHTITAN_TEST_IO_ERROR", "ENOSPC:3")  # no rank: every rank
    with pytest.raises(OSError) as e:
        faults.before_data_file(3, 5, "/ck/b.distcp")
    assert e.value.errno == errno.ENOSPC


def test_rank_filter_and_oom_hooks(monkeypatch):
    monkeypatch.setenv("TORCHTITAN_TEST_OOM_AT_STEP", "2")
    monkeypatch.setenv("TORCHTITAN_TEST_RANK", "1")
    faults.oom_at(2, 0)  # rank 0 is spared
    faults.oom_at(1, 1)  # another step
    with pytest.raises(__import__("torch").cuda.OutOfMemoryError, match="TORCHTITAN_TEST_OOM_AT_STEP=2"):
        faults.oom_at(2, 1)
    monkeypatch.setenv("TORCHTITAN_TEST_SLOW_DATA_SECONDS", "0.01")
    batches = iter([1, 2])
    assert faults.slow_data(batches, 0) is batches
    assert list(faults.slow_data(iter([1, 2]), 1)) == [1, 2]
    monkeypatch.setenv("TORCHTITAN_TEST_OOM_ABOVE", "2")
    faults.oom_above(2)
    with pytest.raises(__import__("torch").OutOfMemoryError, match="batch of 3"):
        faults.oom_above(3)
    monkeypatch.setenv("TORCHTITAN_TEST_NAN_STEP", "7")
    assert faults.nan_step() == 7


def test_kill_at_kills_only_at_its_point_and_only_on_the_first_attempt():
    code = (
        "from torchtitan.testing import faults\n"
        "faults.kill_at('save_begin', 4, 0)\n"  # another point
        "faults.kill_at('step_end', 3, 0)\n"  # another step
        "faults.kill_at('step_end', 4, 1)\n"  # another rank
        "print('alive', flush=True)\n"
        "faults.kill_at('step_end', 4, 0, before=lambda: print('before', flush=True))\n"
        "print('survived', flush=True)\n"
    )
    env = train_env(TORCHTITAN_TEST_FAULT="step_end:4:0", TORCHELASTIC_RESTART_COUNT="0")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == -9 and r.stdout.split() == ["alive", "before"], (r.returncode, r.stdout, r.stderr)
    env["TORCHELASTIC_RESTART_COUNT"] = "1"  # a restarted attempt runs through
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.split() == ["alive", "survived"], r.stderr
