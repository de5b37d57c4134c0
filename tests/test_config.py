"""Config: precedence, strict errors (message + exit code 2, no traceback), round trip of the saved config."""

import subprocess
import sys
from pathlib import Path

import pytest

from torchtitan.config import ConfigError, JobConfig, help_text, parse_args, to_toml, validate

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults():
    cfg = parse_args([])
    assert cfg == JobConfig()
    assert cfg.model.flavor == "debugmodel" and cfg.parallelism.data_parallel_shard_degree == -1


def test_precedence_cli_over_toml_over_default(tmp_path):
    f = write(tmp_path, "[training]\nsteps = 7\nseq_len = 64\n[optimizer]\nlr = 0.5\n")
    cfg = parse_args(["--job.config_file", f, "--training.steps=9"])
    assert cfg.training.steps == 9  # CLI beats TOML
    assert cfg.training.seq_len == 64  # TOML beats default
    assert cfg.optimizer.lr == 0.5
    assert cfg.training.local_batch_size == JobConfig().training.local_batch_size  # default
    assert cfg.job.config_file == f


def test_cli_forms_and_types():
    cfg = parse_args(
        [
            "--training.steps",
            "12",
            "--optimizer.lr=1e-3",
            "--checkpoint.enable",  # bare flag = true
            "--metrics.enable_tensorboard=false",
            "--metrics.peak_tflops",
            "none",
            "--model.vocab_size=4096",
            "--training.mixed_precision_param=float32",
        ]
    )
    assert cfg.training.steps == 12 and cfg.optimizer.lr == 1e-3
    assert cfg.checkpoint.enable is True and cfg.metrics.enable_tensorboard is False
    assert cfg.metrics.peak_tflops is None and cfg.model.vocab_size == 4096
    assert cfg.training.mixed_precision_param == "float32"
    assert parse_args(["--metrics.peak_tflops=312"]).metrics.peak_tflops == 312.0


def test_toml_int_for_float_and_none_via_cli(tmp_path):
    f = write(tmp_path, "[optimizer]\nlr = 1\n[metrics]\npeak_tflops = 100\n")
    cfg = parse_args(["--job.config_file", f, "--metrics.peak_tflops=null"])
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)
    assert cfg.metrics.peak_tflops is None


@pytest.mark.parametrize(
    "argv, toml, expected",
    [
        (["--training.stepz=3"], None, "unknown key 'training.stepz'; did you mean 'training.steps'?"),
        (["--trainig.steps=3"], None, "unknown section 'trainig'; did you mean 'training'?"),
        (["--training.steps=abc"], None, "'training.steps' got 'abc', expected int"),
        (["--checkpoint.enable=maybe"], None, "'checkpoint.enable' got 'maybe', expected bool"),
        (["--lr_scheduler.decay_type=exp"], None, "expected 'linear' | 'cosine'"),
        (["--steps=3"], None, "'--steps' is not of the form --section.key"),
        (["training.steps=3"], None, "unexpected argument 'training.steps=3'"),
        ([], "[training]\nsteps = 'ten'\n", "'training.steps' got 'ten', expected int"),
        ([], "[training]\nstpes = 10\n", "unknown key 'training.stpes'; did you mean 'training.steps'?"),
        ([], "[trianing]\nsteps = 10\n", "unknown section 'trianing'; did you mean 'training'?"),
        ([], "[training]\nmax_norm = true\n", "'training.max_norm' got True, expected float"),
        ([], "steps = 10\n", "top-level key 'steps' must be a [section] table"),
        ([], "[training\nsteps = 10\n", "invalid TOML"),
        ([], "", "holds no settings (empty or only comments)"),
        ([], "# every key left at its default\n", "holds no settings (empty or only comments)"),
    ],
)
def test_errors_name_the_key(tmp_path, argv, toml, expected):
    if toml is not None:
        argv = ["--job.config_file", write(tmp_path, toml)] + argv
    with pytest.raises(ConfigError) as e:
        parse_args(argv)
    assert expected in str(e.value)
    assert "\n" not in str(e.value)
    if toml is not None and "invalid TOML" not in expected:
        assert str(tmp_path) in str(e.value)  # the file is named


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found: /no/such.toml"):
        parse_args(["--job.config_file=/no/such.toml"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("--training.steps=0", "training.steps"),
        ("--optimizer.beta2=1.5", "optimizer.beta2"),
        ("--lr_scheduler.decay_ratio=2", "lr_scheduler.decay_ratio"),
        ("--metrics.log_freq=0", "metrics.log_freq"),
        ("--parallelism.data_parallel_shard_degree=0", "parallelism.data_parallel_shard_degree"),
        ("--parallelism.tensor_parallel_degree=0", "parallelism.tensor_parallel_degree"),
    ],
)
def test_validate_values(override, key):
    with pytest.raises(ConfigError, match=key):
        validate(parse_args([override]))


def test_round_trip_of_saved_config(tmp_path):
    cfg = parse_args(
        [
            "--job.config_file",
            str(ROOT / "train_configs/debug_model.toml"),
            "--training.steps=3",
            '--job.description=a "quoted" text',
            "--metrics.peak_tflops=12.5",
        ]
    )
    saved = write(tmp_path, to_toml(cfg), "saved.toml")
    again = parse_args(["--job.config_file", saved])
    again.job.config_file = cfg.job.config_file
    assert again == cfg


def test_every_shipped_config_parses():
    files = sorted((ROOT / "train_configs").glob("*.toml"))
    assert files
    for f in files:
        validate(parse_args(["--job.config_file", str(f)]))


def test_help_lists_every_option():
    text = help_text()
    cfg = JobConfig()
    for section, table in vars(cfg).items():
        for key in vars(table):
            assert f"--{section}.{key} " in text
    assert "default: 'debugmodel'" in text


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_cli_error_is_one_line_exit_2_no_traceback():
    r = run_cli("--training.stepz=3")
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == "error: command line: unknown key 'training.stepz'; did you mean 'training.steps'?"
    )
    assert "Traceback" not in r.stdout + r.stderr


def test_cli_help_exit_0():
    r = run_cli("--help")
    assert r.returncode == 0 and "--training.steps" in r.stdout


def test_vocab_mismatch_is_one_line_exit_2():
    r = run_cli(
        "--job.config_file=train_configs/debug_model.toml", "--model.vocab_size=4096", "--training.steps=1"
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "2048" in lines[0] and "4096" in lines[0] and "debug.model" in lines[0]
    assert "Traceback" not in r.stdout + r.stderr


def test_run_train_sh_checks_before_torchrun(tmp_path):
    """A bad key is reported once, by the preflight, before any worker starts."""
    r = subprocess.run(
        ["./run_train.sh", "--training.stepz=3"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: command line: unknown key 'training.stepz'; did you mean 'training.steps'?"
    )
    assert "torch.distributed" not in r.stderr and "Traceback" not in r.stderr
