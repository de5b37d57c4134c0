"""Coming from torchtitan: its TOML configs of three eras converted and run, its tokenizers read.

The configs under tests/assets/torchtitan_configs/ use the keys and sections of torchtitan's llama3 files of late
2024, mid 2025 and its last TOML files (Feb 2026); the tokenizers are built offline in the shapes of torchtitan's
test assets (tests/tokenizer_assets.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest
from tokenizer_assets import write_hf_folder, write_tiktoken_file

from conftest import ROOT, import_script, losses, run_script, train_env, train_together
from torchtitan.config import parse_args
from torchtitan.config import torchtitan_compat as compat
from torchtitan.config.manager import ConfigError, _load_toml
from torchtitan.data import build_tokenizer
from torchtitan.data.tokenizer import LLAMA3_SPECIAL_TOKENS, TiktokenTokenizer
from torchtitan.errors import UserError
from torchtitan.preflight import run_checks

CONFIGS = ROOT / "tests" / "assets" / "torchtitan_configs"
ERAS = ("2024", "2025", "2026")
FILES = ("debug_model", "llama3_8b", "llama3_70b", "llama3_405b")
# The world size each file was written for: torchtitan's run_train.sh launches 8 GPUs (debug, 8B); its 70B and
# 405B files use TP 8 and were published with 64 and 128 H100s (FSDP 8 x TP 8, FSDP 16 x TP 8).
WORLD = {"debug_model": 8, "llama3_8b": 8, "llama3_70b": 64, "llama3_405b": 128}

convert_script = import_script("convert_torchtitan_config")


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    d = tmp_path_factory.mktemp("toks")
    small = write_tiktoken_file(d / "tiktoken" / "tokenizer.model", 2000)
    hf = write_hf_folder(d / "hf")
    # Llama 3's size (128,000 ranks + 256 specials = 128,256), for the 8B/70B/405B preflights: the 256 bytes,
    # then distinct multi-byte tokens (a valid tiktoken file; its merges are not a trained BPE's)
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(b'w%d' % i).decode()} {256 + i}" for i in range(128000 - 256)]
    big = d / "llama3" / "original" / "tokenizer.model"
    big.parent.mkdir(parents=True)
    big.write_text("\n".join(lines) + "\n")
    return {"tiktoken": small, "hf": hf, "llama3": d / "llama3"}


# ------------------------------------------------------------------------------------------------ tokenizers


def test_tiktoken_tokenizer_has_llama3_special_tokens_and_split_pattern(toks):
    tok = build_tokenizer(str(toks["tiktoken"]))
    assert isinstance(tok, TiktokenTokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (2256, 2000, 2001)  # 2,000 ranks + 256 specials
    assert len(LLAMA3_SPECIAL_TOKENS) == 256
    sp = tok.special_tokens
    assert (sp["<|start_header_id|>"], sp["<|end_header_id|>"], sp["<|eot_id|>"]) == (2006, 2007, 2009)
    assert sp["<|reserved_special_token_250|>"] == 2255
    text = "Lily had 12345 red balls. <|eot_id|> The end."
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == 2000 and ids[-1] == 2001 and all(i < 2000 for i in ids[1:-1])  # special text stays text
    assert tok.decode(ids[1:-1]) == text
    # Meta's folder layout (original/tokenizer.model) and a folder holding the file itself
    assert build_tokenizer(str(toks["llama3"])).vocab_size == 128256
    assert isinstance(build_tokenizer(str(toks["tiktoken"].parent)), TiktokenTokenizer)


def test_tiktoken_splits_text_with_llama3s_pattern(tmp_path):
    # Ranks chosen so the result tells the pattern: Llama 3's splits digits into groups of at most 3 ("123",
    # "45"); one piece "12345" would merge "34" first (the lowest rank) and give "12", "34", "5".
    merged = [b"34", b"12", b"123", b"45"]
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(t).decode()} {256 + i}" for i, t in enumerate(merged)]
    (tmp_path / "tokenizer.model").write_text("\n".join(lines) + "\n")
    tok = build_tokenizer(str(tmp_path / "tokenizer.model"))
    assert tok.vocab_size == 260 + 256
    assert [tok.decode([i]) for i in tok.encode("12345")] == ["123", "45"]


def test_hf_folder_whose_bos_eos_live_only_in_tokenizer_config(toks):
    vocab = json.loads((toks["hf"] / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 2002 and "<|begin_of_text|>" not in vocab
    tok = build_tokenizer(str(toks["hf"]))
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (2004, 2002, 2003)
    ids = tok.encode("The cat sat.", bos=True, eos=True)
    assert ids[0] == 2002 and ids[-1] == 2003 and tok.decode(ids[1:-1]) == "The cat sat."


def test_tokenizer_of_another_format_is_named_in_one_line(tmp_path):
    cases = {
        "weights.bin": (b"\x00\x01binary", "none of the accepted formats"),
        "tokenizer.model": (b"QUJD 0\nnot base64 line\n", "line 2 is not '<base64 token> <rank>'"),
        "gaps.model": (b"QQ== 0\nQg== 5\n", "ranks of its 2 tokens are not 0..1"),
    }
    for name, (content, words) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError) as e:
            build_tokenizer(str(tmp_path / name))
        msg = str(e.value)
        assert words in msg and str(tmp_path / name) in msg and "\n" not in msg
    with pytest.raises(UserError) as e:
        build_tokenizer(str(tmp_path / "weights.bin"))
    assert "tiktoken BPE file" in str(e.value) and "tokenizer.json" in str(e.value)


# ------------------------------------------------------------------------------------------------ conversion


def _convert(era, name, **kw):
    path = CONFIGS / era / f"{name}.toml"
    return compat.convert(_load_toml(str(path)), str(path), **kw)


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("name", FILES)
def test_every_file_converts_and_passes_preflight_at_its_world_size(era, name, toks, tmp_path, capsys):
    src = CONFIGS / era / f"{name}.toml"
    with pytest.raises(ConfigError, match="is a torchtitan config .*convert_torchtitan_config.py"):
        parse_args([f"--job.config_file={src}"])  # given directly: refused with the converter command

    debug = name == "debug_model"
    tok = toks["tiktoken" if era == "2024" else "hf"] if debug else toks["llama3"]
    out = tmp_path / "ours.toml"
    assert convert_script.main([str(src), "-o", str(out), "--tokenizer-path", str(tok)]) == 0
    printed = capsys.readouterr().out
    conv = _convert(era, name, tokenizer_path=str(tok))
    kinds = {k for k, _ in conv.decisions}
    assert {"dropped", "warning"} <= kinds and len(printed.splitlines()) == len(conv.decisions) + 1
    text = "\n".join(t for _, t in conv.decisions)
    assert f"era {era}" in text
    assert "torchtitan decays every parameter" in text  # weight decay on norms and embeddings
    assert ("s/(w+1) here" in text) == (era != "2024")  # warmup factor: s/w in torchtitan after 2024
    cfg = conv.config
    if debug:
        assert cfg["model"]["n_kv_heads"] == 16  # torchtitan's debugmodel has no GQA
        assert cfg["model"].get("n_layers") == (
            8 if era == "2024" else None
        )  # 8 blocks until 2025-04, 6 since
        assert cfg["model"]["vocab_size"] == (2256 if era == "2024" else 2004)  # from the tokenizer
        assert cfg["model"].get("rope_scaling_factor") == (8.0 if era == "2026" else None)
        assert cfg["data"]["dataset"] == "debug_corpus"  # c4_test
    else:
        assert cfg["model"].get("rope_scaling_factor") == (None if era == "2026" else 1.0)
        assert cfg["data"]["dataset"] == "c4"
    assert cfg["checkpoint"].get("keep_latest_k", 0) == (0 if era == "2024" else 10)
    if name == "llama3_405b":
        assert cfg["float8"]["enable"] is True and cfg["compile"]["enable"] is True
        assert any(k == "unsupported" and "enable_async_tensor_parallel" in t for k, t in conv.decisions)
    if era != "2024" and debug or era == "2026":
        assert cfg["validation"]["dataset"] == "c4" and cfg["validation"]["split"] == "validation"

    # C4 needs the network: the preflight reads the offline corpus instead
    args = [f"--job.config_file={out}", f"--job.dump_folder={tmp_path / 'run'}"]
    if not debug:
        args.append("--data.dataset=debug_corpus")
    rc = run_checks(parse_args(args), WORLD[name])
    report = capsys.readouterr().out
    assert rc == 0, report
    assert f"world size {WORLD[name]}" in report


@pytest.mark.parametrize(
    "section, key, value, words",
    [
        ("metrics", "save_tb_folder", '"board"', 'metrics.save_tb_folder = "board" cannot be expressed'),
        ("model", "flavor", '"debugmodel_flex_attn"', "flex/varlen attention"),
        ("lr_scheduler", "decay_type", '"sqrt"', 'lr_scheduler.decay_type = "sqrt" cannot be expressed'),
        ("training", "dataset", '"fineweb"', "built-in sources are c4 and debug_corpus"),
        ("model", "converters", '["mx"]', "only float8"),
        ("checkpoint", "interval_type", '"seconds"', "checkpoint.interval counts steps here"),
        ("parallelism", "expert_parallel_degree", "2", "no MoE models here"),
        ("training", "flux_magic", "1", "unknown to this converter"),
    ],
)
def test_a_value_that_cannot_be_expressed_is_one_line_exit_2(section, key, value, words, tmp_path, capsys):
    src = (CONFIGS / "2025" / "llama3_8b.toml").read_text()
    bad = tmp_path / "bad.toml"
    if f"[{section}]" in src:
        text = src.replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n", 1)
        text = "\n".join(
            line for line in text.splitlines() if not (line.startswith(f"{key} =") and value not in line)
        )
    else:
        text = src + f"\n[{section}]\n{key} = {value}\n"
    bad.write_text(text)
    out = tmp_path / "out.toml"
    assert convert_script.main([str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and words in err, err
    assert not out.exists()


def _variant(era: str, edits: dict[str, dict], drop: tuple[str, ...] = ()) -> dict:
    """The era's llama3_8b.toml, parsed, with keys set per section ("quantize.dense.float8" nests) and the
    dotted keys in `drop` removed: the shape of a torchtitan file of another month."""
    toml = _load_toml(str(CONFIGS / era / "llama3_8b.toml"))
    for dotted in drop:
        *path, key = dotted.split(".")
        table = toml
        for part in path:
            table = table[part]
        del table[key]
    for section, values in edits.items():
        table = toml
        for part in section.split("."):
            table = table.setdefault(part, {})
        table.update(values)
    return toml


_NO_FLOAT8_SECTION = ("float8.enable_float8_linear",)  # the [float8] section came after these switches


# Keys of torchtitan's files from its public release (Apr 2024) to its last TOML files, beyond the three eras of
# tests/assets/torchtitan_configs: each as torchtitan's history wrote it (the month in the comment), and where it
# lands here. A sweep of every llama TOML file in torchtitan's history is in docs/configuration.md.
@pytest.mark.parametrize(
    "era, edits, drop, expect",
    [
        # 2024-04 .. 12: a colour switch, one data-parallel degree (2024-04 .. 07), PP under [training] (to 2024-05)
        ("2024", {"metrics": {"enable_color_printing": True}}, (), {}),
        (
            "2024",
            {"training": {"data_parallel_degree": -1, "pipeline_parallel_degree": 2}},
            (
                "training.data_parallel_replicate_degree",
                "training.data_parallel_shard_degree",
                "experimental.pipeline_parallel_degree",
            ),
            {"parallelism.data_parallel_shard_degree": -1, "parallelism.pipeline_parallel_degree": 2},
        ),
        # float8 switches of 2024: a string ("dynamic", to 2024-07), a bool (2024-07), then enable_*_linear
        ("2024", {"training": {"fp8_linear": "dynamic"}}, _NO_FLOAT8_SECTION, {"float8.enable": True}),
        ("2024", {"training": {"fp8_linear": True}}, _NO_FLOAT8_SECTION, {"float8.enable": True}),
        ("2024", {"training": {"fp8_linear": False}}, _NO_FLOAT8_SECTION, {"float8.enable": None}),
        (
            "2024",
            {"training": {"enable_float8_linear": True}},
            ("float8.enable_float8_linear",),
            {"float8.enable": True},
        ),
        # RMSNorm kernels (2024-04 .. 07): the same norm
        ("2024", {"model": {"norm_type": "fused_rmsnorm"}}, (), {}),
        ("2024", {"model": {"norm_type": "compiled_rmsnorm"}}, (), {}),
        # 2025: FSDP resharding under [training] (2025-02 .. 03), the weights-only last save (2025-06 .. 07),
        # filter_fqns as a string (2025-04) and with a name no Llama 3 linear has (2025-10)
        (
            "2025",
            {"training": {"fsdp_reshard_after_forward": "never"}},
            (),
            {"parallelism.fsdp_reshard_after_forward": "never"},
        ),
        (
            "2025",
            {"checkpoint": {"last_save_model_weights_only": False}},
            ("checkpoint.last_save_model_only",),
            {"checkpoint.last_save_model_only": False},
        ),
        ("2025", {"float8": {"filter_fqns": "output"}}, (), {}),
        ("2025", {"float8": {"filter_fqns": ["output", "router.gate"]}}, (), {}),
        # 2025-09: [quantize.dense.float8] before it became [quantize.linear.float8]; MX / grouped-GEMM filters
        (
            "2026",
            {"quantize.dense.float8": {"enable_fsdp_float8_all_gather": True}},
            (),
            {"float8.enable_fsdp_float8_all_gather": True},
        ),
        (
            "2026",
            {"quantize.linear.mx": {"filter_fqns": ["output"]}, "quantize.grouped_mm.float8": {"fqns": []}},
            (),
            {},
        ),
        # the profiler's window (2025-10): dropped with the nearest, not refused
        ("2026", {"profiling": {"profiler_active": 10, "profiler_warmup": 0}}, (), {}),
    ],
)
def test_keys_of_other_months_convert(era, edits, drop, expect):
    conv = compat.convert(_variant(era, edits, drop), "variant.toml")
    for dotted, value in expect.items():
        section, key = dotted.split(".", 1)
        assert conv.config.get(section, {}).get(key) == value, (dotted, conv.config.get(section))
    text = "\n".join(t for _, t in conv.decisions)
    for section, values in edits.items():
        for key in values:
            assert f"{section}.{key}" in text  # every key is explained


@pytest.mark.parametrize(
    "era, edits, words",
    [
        ("2024", {"training": {"fp8_linear": "delayed"}}, "scales dynamically"),
        ("2024", {"model": {"norm_type": "layernorm"}}, "only norm here"),
        ("2025", {"float8": {"filter_fqns": ["output", "feed_forward.w2"]}}, "not by name"),
        ("2024", {"profiling": {"run_profiler": True}}, "first months"),
        ("2024", {"training": {"checkpoint_folder": "ckpt"}}, "first months"),
    ],
)
def test_values_of_other_months_that_cannot_be_expressed(era, edits, words):
    with pytest.raises(compat.ConversionError, match=words):
        compat.convert(_variant(era, edits), "variant.toml")


def test_schedules_the_converter_knows_are_the_configs_and_the_pipelines():
    """One list of schedules: the converter takes its names from the config's Literal, which must be the
    pipeline's table, and its multi-stage ones (given 2 stages a rank, as torchtitan does) that table's column."""
    from torchtitan.parallel.pipeline import SCHEDULES

    assert compat._SCHEDULES == tuple(SCHEDULES)
    assert set(compat._MULTI_STAGE) == {name for name, (_, multi, _, _) in SCHEDULES.items() if multi}


@pytest.mark.parametrize(
    "name, flavor, shape",
    [
        # torchtitan's Llama 2 model: "llama2" from 2024-04-19 to 2024-12-03, "llama" before (2 debug layers then)
        ("llama2", "7B", {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32}),
        ("llama2", "13B", {"dim": 5120, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40}),
        ("llama2", "70B", {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8}),  # FFN checked below
        ("llama", "debugmodel", {"dim": 256, "n_layers": 2, "n_heads": 16, "n_kv_heads": 16}),
    ],
)
def test_torchtitans_llama2_models_convert_to_their_shapes(name, flavor, shape, tmp_path):
    from torchtitan.models import model_args_from_config

    conv = compat.convert(_variant("2024", {"model": {"name": name, "flavor": flavor}}), "llama2.toml")
    model = conv.config["model"]
    assert model["name"] == "llama3" and model["flavor"] == "custom" and model["rope_theta"] == 10000.0
    assert {k: model[k] for k in shape} == shape
    assert (
        model["vocab_size"] == compat.LLAMA2_VOCAB
    )  # the file's tokenizer is not here: Llama 2's, with a warning
    assert any("32,000 is Llama 2's" in t for _, t in conv.decisions)
    out = tmp_path / "ours.toml"
    out.write_text(compat.to_toml(conv, "llama2.toml"))
    cfg = parse_args([f"--job.config_file={out}"])
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    if flavor == "7B":
        assert args.ffn_hidden_dim == 11008  # Llama 2 7B
    if flavor == "70B":
        assert args.ffn_hidden_dim == 28672  # Llama 2 70B


def test_local_dataset_paths_and_the_written_file(tmp_path, capsys):
    from torchtitan.preflight import main as preflight_main

    src = (CONFIGS / "2024" / "debug_model.toml").read_text()
    files = tmp_path / "c4_test"
    files.mkdir()
    (files / "c4-train.00000-of-00001.json").write_text('{"text": "one document"}\n')
    path = tmp_path / "tt.toml"
    path.write_text(src.replace('dataset = "c4_test"', f'dataset = "c4_test"\ndataset_path = "{files}"'))
    assert preflight_main([f"--job.config_file={path}"]) == 2  # a torchtitan file, given directly
    assert "convert_torchtitan_config.py" in capsys.readouterr().err
    out = tmp_path / "ours.toml"
    assert convert_script.main([str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f'training.dataset_path = "{files}" -> data.dataset_path = "{files}"' in printed
    text = out.read_text()
    assert (
        text.startswith("# Converted from the torchtitan config")
        and "#   renamed     training.batch_size" in text
    )
    cfg = parse_args([f"--job.config_file={out}"])
    assert (cfg.data.dataset_path, cfg.training.local_batch_size, cfg.model.n_kv_heads) == (str(files), 8, 16)
    assert convert_script.main([str(path), "-o", str(out)]) == 2  # never overwritten without --force
    assert "--force" in capsys.readouterr().err


def test_validation_steps_minus_one_with_validation_on_is_refused(tmp_path, capsys):
    src = (CONFIGS / "2026" / "debug_model.toml").read_text()
    bad = tmp_path / "v.toml"
    bad.write_text(
        src.replace("enable = false\ndataset", "enable = true\ndataset").replace(
            "steps = 10\n", "steps = -1\n"
        )
    )
    assert convert_script.main([str(bad), "-o", str(tmp_path / "o.toml")]) == 2
    assert "validation.steps = -1 cannot be expressed" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the parser


@pytest.mark.parametrize(
    "option, answer, never",
    [
        ("checkpoint.enable_checkpoint", "'checkpoint.enable'", "create_seed_checkpoint"),
        ("training.compile", "'compile.enable'", "training.seed"),
        ("model.converters", "float8.enable = true", "norm_eps"),
        ("training.batch_size", "'training.local_batch_size'", "global_batch_size"),
        ("training.warmup_steps", "'lr_scheduler.warmup_steps'", "did you mean"),
        ("checkpoint.model_weights_only", "'checkpoint.last_save_model_only'", "did you mean"),
        ("lr_scheduler.lr_min", "'lr_scheduler.min_lr_factor'", "did you mean"),
    ],
)
def test_did_you_mean_answers_torchtitan_names_with_their_equivalent(option, answer, never):
    with pytest.raises(ConfigError) as e:
        parse_args([f"--{option}=1"])
    msg = str(e.value)
    assert answer in msg and never not in msg, msg


def test_torchtitans_registry_launch_names_the_shipped_file(tmp_path):
    """torchtitan's launch since its config registry (`--module llama3 --config llama3_8b`, pytorch/torchtitan#2386)
    gets one line naming the file shipped here for that run, every named file exists, and an entry without a
    counterpart lists the shipped ones; the trainer: that line alone, exit 2, no traceback, nothing written."""
    from torchtitan.config.torchtitan_keys import REGISTRY_COUNTERPARTS

    for entry, shipped in REGISTRY_COUNTERPARTS.items():
        assert (ROOT / shipped).is_file(), shipped
        with pytest.raises(ConfigError) as e:
            parse_args(["--module", "llama3", "--config", entry, "--training.steps", "10"])
        msg = str(e.value)
        assert f"'--module llama3 --config {entry}' is torchtitan's config registry" in msg
        assert f"--job.config_file={shipped}" in msg and msg.count("--job.config_file=") == 1
    with pytest.raises(
        ConfigError, match=r"--config llama3_8b_mxfp8' .* shipped: train_configs/debug_model.toml"
    ):
        parse_args(["--config=llama3_8b_mxfp8"])
    r = subprocess.run(
        [sys.executable, "train.py", "--module", "llama3", "--config", "llama3_8b", f"--job.dump_folder={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "error: command line: '--module llama3 --config llama3_8b' is torchtitan's config registry (its launch since"
        " pytorch/torchtitan#2386, Feb 2026), which this trainer does not read; the file shipped here for that run is"
        " --job.config_file=train_configs/llama3_8b.toml (docs/configuration.md, 'Coming from torchtitan')"
    ]
    assert not any(tmp_path.iterdir())


def test_our_own_typos_still_get_did_you_mean():
    with pytest.raises(ConfigError, match="did you mean 'training.steps'"):
        parse_args(["--training.stepz=3"])


# ------------------------------------------------------------------------------------------------ dataset keys


def test_validation_dataset_is_checked_by_preflight_naming_its_key(tmp_path, capsys):
    base = [f"--job.dump_folder={tmp_path}", "--validation.enable=true"]
    cases = [
        (["--validation.dataset=c4_validation"], "validation.dataset 'c4_validation' is unknown"),
        (["--validation.split=test"], "validation.split 'test' not found"),
        ([f"--validation.dataset_path={tmp_path / 'none'}"], f"validation.dataset_path {tmp_path / 'none'}"),
    ]
    for extra, words in cases:
        assert run_checks(parse_args(base + extra), 1) == 2
        out = capsys.readouterr()
        assert "preflight: validation FAIL" in out.out and words in out.err, out


def test_dry_run_names_the_validation_key(tmp_path):
    r = run_script(
        1,
        "train.py",
        [
            "--job.dry_run=true",
            f"--job.dump_folder={tmp_path}",
            "--validation.enable=true",
            "--validation.dataset=c4_validation",
        ],
        timeout=120,
    )
    assert r.returncode == 2
    assert "validation.dataset 'c4_validation' is unknown" in r.stderr


# ------------------------------------------------------------------------------------------------ training


@pytest.fixture(scope="module")
def converted_debug(toks, tmp_path_factory):
    d = tmp_path_factory.mktemp("converted")
    out = {}
    for era in ERAS:
        tok = toks["tiktoken" if era == "2024" else "hf"]
        out[era] = d / f"debug_{era}.toml"
        rc = convert_script.main(
            [str(CONFIGS / era / "debug_model.toml"), "-o", str(out[era]), "--tokenizer-path", str(tok)]
        )
        assert rc == 0
    return out


SMALL = ["--training.seq_len=64", "--training.local_batch_size=2", "--metrics.peak_tflops=1"]


@pytest.fixture(scope="module")
def trained(converted_debug, tmp_path_factory):
    """Each era's converted debug config, 3 steps on 2 processes (the three runs in one torchrun)."""
    runs = {}
    for era in ERAS:
        runs[era] = [f"--job.config_file={converted_debug[era]}", "--training.steps=3", *SMALL]
        if era == "2024":  # also save, for the perplexity and generation check below
            runs[era] += ["--checkpoint.enable=true"]
    return train_together(2, runs, tmp_path_factory.mktemp("trained"), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("era", ERAS)
def test_converted_debug_config_trains_on_cpu_with_2_processes(era, converted_debug, trained):
    out = trained[era]
    loss = losses(out)
    assert sorted(loss) == [1, 2, 3] and all(v == v for v in loss.values())
    if era != "2024":
        return
    # the same tiktoken tokenizer for perplexity and generation, from the run's checkpoint
    common = [f"--job.config_file={converted_debug[era]}", *SMALL, "--validation.steps=2"]
    ppl = run_script(
        1, "scripts/perplexity.py", [*common, "--checkpoint", str(out / "checkpoint")], timeout=300
    )
    assert ppl.returncode == 0, ppl.stderr[-2000:]
    assert ppl.stdout.startswith("perplexity ")
    gen = run_script(
        1,
        "scripts/generate.py",
        [*common, "--checkpoint", str(out / "checkpoint"), "--prompt", "Lily had", "--max_new_tokens", "5"],
        timeout=300,
        env=train_env(),
    )
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert gen.stdout.startswith("Lily had")


def test_history_script_refuses_a_folder_that_is_not_a_clone_in_one_line(tmp_path, capsys):
    history = import_script("convert_torchtitan_history")
    assert history.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "not a git clone" in err and "\n" not in err
