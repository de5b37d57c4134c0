"""scripts/pytest_cpu_times.py: the plugin records each test's CPU, its own and its children's, and the summary
ranks files and tests by it (docs/testing.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, train_env

BUSY = """
import subprocess, sys, time

def test_spends_in_a_child():
    subprocess.run([sys.executable, "-c", "t = __import__('time').process_time()\\nwhile __import__('time').process_time() - t < 0.3: pass"], check=True)

def test_spends_itself():
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
"""


def test_records_own_and_child_cpu_and_summarizes_by_file(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY)
    env = train_env(CPU_TIMES_DIR=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT / "scripts"))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pytest_cpu_times", "-p", "no:cacheprovider", "test_busy.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "cpu" / "cpu_main.jsonl").open()}
    child, own = rows["test_busy.py::test_spends_in_a_child"], rows["test_busy.py::test_spends_itself"]
    assert child["children"] >= 0.3 and own["self"] >= 0.2 and own["children"] == 0
    assert all(r["wall"] > 0 for r in rows.values())
    out = subprocess.run(
        [sys.executable, "scripts/pytest_cpu_times.py", str(tmp_path / "cpu"), "--top", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("2 tests, ") and any(line.endswith("  test_busy.py") for line in lines)
    tests = [line.split()[-1] for line in lines if "::" in line]
    assert tests == [
        "test_busy.py::test_spends_in_a_child",
        "test_busy.py::test_spends_itself",
    ]  # most CPU first


def test_summary_of_an_empty_folder_is_one_line_exit_2(tmp_path):
    r = subprocess.run(
        [sys.executable, "scripts/pytest_cpu_times.py", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (
        r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: no cpu_*.jsonl in ")
    )
