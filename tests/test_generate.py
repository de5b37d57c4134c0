"""Generation: the KV cache gives exactly what full recomputation gives, converted HF weights generate what
transformers generates, sampling options behave, int8 stays close to bf16, the CLI and the benchmark (fields,
OOM halving, errors), and tensor parallel over 2 processes gives the tokens of 1 process."""

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import ROOT, run_script, train_env
from torchtitan.checkpoint import write_marker
from torchtitan.checkpoint.hf import hf_to_dcp
from torchtitan.config import JobConfig
from torchtitan.errors import UserError
from torchtitan.generate import (
    Sampling,
    generate,
    load_model,
    make_decode_step,
    quantize_weights,
    rouge1_f1,
    sample,
)
from torchtitan.generate.benchmark import percentile
from torchtitan.models.llama3 import ModelArgs, Transformer, get_model_args

PROMPTS_FILE = ROOT / "tests/assets/prompts/debug_continuations.jsonl"
TOKENIZER = ROOT / "tests/assets/tokenizer/debug.model"
EOS = 2


def debug_model(dtype=torch.float32, **overrides) -> Transformer:
    model = Transformer(get_model_args("debugmodel", max_seq_len=256, **overrides))
    model.init_weights(seed=0)
    return model.to(dtype).eval()


def mixed_prompts(lengths=(5, 17, 1, 30), vocab=2048, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def full_recompute_greedy(model, prompt, max_new_tokens, eos_id) -> list[int]:
    """The reference: no cache, no batch, no padding; the whole sequence through the model every step."""
    seq, new = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            new.append(nxt)
            seq.append(nxt)
            if nxt == eos_id:
                break
    return new


# ------------------------------------------------------------------------------------------------ KV cache


@pytest.mark.parametrize("static_shapes", [False, True])
def test_cached_greedy_equals_full_recompute_for_mixed_lengths(static_shapes):
    model = debug_model()
    prompts = mixed_prompts()
    out = generate(model, prompts, max_new_tokens=24, eos_id=EOS, static_shapes=static_shapes, cache_len=80)
    for prompt, got in zip(prompts, out.tokens):
        assert got == full_recompute_greedy(model, prompt, 24, EOS)
    assert all(len(t) == 24 for t in out.tokens)  # no EOS in 24 greedy steps of this random model
    assert len(out.decode_s) == 23 and out.prefill_s > 0 and out.first_token_s >= out.prefill_s
    assert all(m.attention.kv_cache is None for m in model.layers.values())  # caches dropped afterwards


def test_rows_stop_on_eos_independently():
    model = debug_model()
    prompts = mixed_prompts()
    free = generate(model, prompts, max_new_tokens=12, eos_id=EOS).tokens
    # declare row 1's 4th token the EOS: row 1 stops there (EOS kept as its last token), the others continue
    # unchanged (their tokens never equal it before the end, checked) and the batch ends at 12 tokens
    eos = free[1][3]
    assert all(eos not in row for i, row in enumerate(free) if i != 1)
    out = generate(model, prompts, max_new_tokens=12, eos_id=eos).tokens
    assert out[1] == free[1][: free[1].index(eos) + 1]
    assert [row for i, row in enumerate(out) if i != 1] == [row for i, row in enumerate(free) if i != 1]
    # every row stopping ends the loop early
    single = generate(model, [prompts[1]], max_new_tokens=12, eos_id=eos)
    assert single.tokens == [out[1]] and len(single.decode_s) == len(out[1]) - 1


def test_bf16_cached_generation_runs_and_matches_its_own_full_recompute_prefix():
    model = debug_model(torch.bfloat16)
    prompts = mixed_prompts((3, 11))
    out = generate(model, prompts, max_new_tokens=6, eos_id=EOS)
    # bf16 rounding differs between batched/cached and single full passes; the first token comes from the
    # same prompt computation and must agree
    for prompt, got in zip(prompts, out.tokens):
        assert got[0] == full_recompute_greedy(model, prompt, 1, EOS)[0]


def test_too_long_is_a_user_error():
    model = debug_model()
    with pytest.raises(UserError, match="max_seq_len 256"):
        generate(model, [[5] * 200], max_new_tokens=100, eos_id=EOS)
    with pytest.raises(UserError, match="max_new_tokens"):
        generate(model, [[5]], max_new_tokens=0, eos_id=EOS)


def test_compiled_decode_step_gives_the_eager_tokens():
    """torch.compile of the decode step (tiny model: compiling takes ~tens of seconds on 2 CPU cores)."""
    model = Transformer(
        ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
    )
    model.init_weights(seed=1)
    model.eval()
    prompts = mixed_prompts((3, 7), vocab=128)
    eager = generate(model, prompts, max_new_tokens=5, eos_id=EOS, cache_len=16, static_shapes=True)
    step = make_decode_step(model, compile=True)
    compiled = generate(model, prompts, 5, EOS, decode_step=step, cache_len=16, static_shapes=True)
    assert compiled.tokens == eager.tokens


# ------------------------------------------------------------------------------------------------- sampling


def test_sampling_options():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    greedy = logits.argmax(-1)
    g = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    assert torch.equal(sample(logits, Sampling()), greedy)
    assert torch.equal(sample(logits, Sampling(temperature=1.0, top_k=1), g(0)), greedy)
    assert torch.equal(sample(logits, Sampling(temperature=1.0, top_p=1e-6), g(0)), greedy)
    s = Sampling(temperature=1.0)
    assert torch.equal(sample(logits, s, g(3)), sample(logits, s, g(3)))  # same seed, same draw
    draws = torch.stack([sample(logits, s, g(i)) for i in range(50)])
    assert len({tuple(d.tolist()) for d in draws}) > 1  # different seeds, different draws
    top3 = logits.topk(3, dim=-1).indices
    k3 = torch.stack([sample(logits, Sampling(1.0, top_k=3), g(i)) for i in range(200)])
    assert all(int(k3[j, r]) in top3[r].tolist() for j in range(200) for r in range(4))
    # top_p: a distribution with probabilities 0.5, 0.3, 0.2 and p = 0.75 keeps exactly the first two
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    drawn = {int(sample(probs.log(), Sampling(1.0, top_p=0.75), g(i))) for i in range(200)}
    assert drawn == {0, 1}
    with pytest.raises(UserError, match="--top_p"):
        Sampling(1.0, top_p=1.5)
    with pytest.raises(UserError, match="--temperature"):
        Sampling(-1.0)


def test_sampled_generation_is_deterministic_for_a_seed():
    model = debug_model()
    prompts = mixed_prompts((4, 9))
    s = Sampling(temperature=0.8, top_k=50, top_p=0.9)
    run = lambda seed: generate(model, prompts, 10, EOS, s, torch.Generator().manual_seed(seed)).tokens  # noqa: E731
    assert run(7) == run(7)
    assert run(7) != run(8)


# ------------------------------------------------------------------------------------------- quantization


def test_int8_weight_only_logits_within_tolerance_of_bf16():
    """Stated tolerance: with per-row int8 weights (rounding error <= max|row| / 254 per weight), the debug
    model's logits differ from bf16 by at most 5% of the largest logit and 1% of it on average."""
    pytest.importorskip("torchao")
    ref = debug_model(torch.bfloat16)
    quant = debug_model(torch.bfloat16)
    quantize_weights(quant, "int8")
    assert type(quant.layers["0"].attention.wq.weight).__name__ == "Int8Tensor"
    tokens = torch.tensor(mixed_prompts((32, 32, 32)))
    with torch.no_grad():
        a, b = ref(tokens).float(), quant(tokens).float()
    scale = a.abs().max()
    assert (a - b).abs().max() <= 0.05 * scale
    assert (a - b).abs().mean() <= 0.01 * scale


# --------------------------------------------------------------------------------------- Hugging Face parity


def test_generation_from_converted_hf_weights_equals_transformers_generate(tmp_path):
    pytest.importorskip("transformers")
    from test_checkpoint_hf import make_hf_model

    vocab = 128
    hf = make_hf_model(
        tmp_path / "hf",
        vocab_size=vocab,
        n_layers=2,
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=160,
    )
    cfg = JobConfig()
    loaded = load_model(cfg, str(tmp_path / "hf"), torch.device("cpu"), torch.float32)
    prompts = mixed_prompts((3, 9, 14, 6), vocab=vocab, seed=2)
    # EOS := row 0's 5th greedy token, so row 0 stops early (in both implementations) and others may not
    eos = generate(loaded.model, prompts[:1], max_new_tokens=5, eos_id=-1).tokens[0][4]
    ours = generate(loaded.model, prompts, max_new_tokens=16, eos_id=eos).tokens

    pad = 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=16,
            eos_token_id=eos,
            pad_token_id=pad,
        )[:, width:].tolist()
    for row_ours, row_theirs in zip(ours, theirs):
        assert row_ours == row_theirs[: len(row_ours)]
        assert all(t == pad for t in row_theirs[len(row_ours) :])  # transformers pads after a row's EOS
    assert len(ours[0]) <= 5 and ours[0][-1] == eos
    # the same weights converted to DCP on disk (scripts/convert_hf_to_dcp.py's function) generate the same
    hf_to_dcp(tmp_path / "hf", tmp_path / "dcp")
    converted = load_model(cfg, str(tmp_path / "dcp"), torch.device("cpu"), torch.float32)
    assert generate(converted.model, prompts, max_new_tokens=16, eos_id=eos).tokens == ours


# ------------------------------------------------------------------------------------------------- ROUGE-1


def test_rouge1_f1():
    # overlap the(2) cat on mat = 5 of 6 words on each side: P = R = F1 = 5/6
    assert rouge1_f1("The cat sat on the mat.", "the cat is on the MAT") == pytest.approx(5 / 6)
    # P = 1/1, R = 1/4 -> F1 = 2 * 0.25 / 1.25 = 0.4; punctuation only separates words
    assert rouge1_f1("cat!", "a cat, a dog") == pytest.approx(0.4)
    assert rouge1_f1("", "anything") == 0.0
    assert rouge1_f1("x y", "z") == 0.0


def test_percentile_interpolates_like_numpy():
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == pytest.approx(9.1)
    assert percentile([5.0], 90) == 5.0 and percentile([], 50) is None


# ------------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    """A committed model-only checkpoint of the (random) debug model at <root>/checkpoint/step-3."""
    root = tmp_path_factory.mktemp("gen")
    step = root / "checkpoint" / "step-3"
    model = debug_model()
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)
    write_marker(str(step), {"kind": "export", "step": 3})
    return root


def generate_cli(args, nproc=1, env=None, timeout=300):
    base = ["--job.config_file=train_configs/debug_model.toml", "--job.print_config=false"]
    if nproc == 1:
        return subprocess.run(
            [sys.executable, "scripts/generate.py", *base, *args],
            cwd=ROOT,
            env=env or train_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    return run_script(nproc, "scripts/generate.py", base + args, timeout=timeout, env=env)


def test_cli_prompt_prints_prompt_and_continuation_only(checkpoint_root):
    prompt = "Once upon a time"
    r = generate_cli(
        [f"--checkpoint={checkpoint_root / 'checkpoint'}", "--prompt", prompt, "--max_new_tokens=8"]
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(prompt) and len(r.stdout) > len(prompt) + 1
    assert "[rank0]" not in r.stdout and "loaded" not in r.stdout
    assert "step-3" in r.stderr  # the log names the checkpoint (newest committed step), on stderr


def test_cli_benchmark_json_has_every_field_and_oom_halves_the_batch(checkpoint_root, tmp_path):
    out = tmp_path / "bench.json"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(PROMPTS_FILE.read_text().splitlines()[:8]) + "\n")
    r = generate_cli(
        [
            f"--checkpoint={checkpoint_root / 'checkpoint' / 'step-3'}",
            f"--prompts={prompts}",
            "--benchmark",
            "--batch_size=8",
            "--max_new_tokens=6",
            f"--json={out}",
            "--estimate.peak_tflops=0.2",  # a CPU has no datasheet: the estimator column needs its rates
            "--estimate.hbm_bandwidth_gbps=10",
        ],
        env=train_env(TORCHTITAN_TEST_OOM_ABOVE="2"),
    )
    assert r.returncode == 0, r.stderr
    assert "a batch of 8 prompts ran out of memory" in r.stderr and "halving to 4" in r.stderr
    assert "ROUGE-1 F1" in r.stdout and "documents/s" in r.stdout  # the table
    res = json.loads(out.read_text())
    assert res["batch_size_requested"] == 8 and res["batch_size_reached"] == 2
    assert res["oom_batch_sizes"] == [8, 4]
    assert res["documents"] == 8 and res["batches"] == 4 and len(res["completions"]) == 8
    for key in ("ttft_s", "prefill_s", "decode_token_s"):
        assert res[key]["median"] > 0 and res[key]["p90"] >= res[key]["median"], key
    for key in ("generated_tokens_per_s", "documents_per_s", "total_s", "tokenize_s", "detokenize_s"):
        assert res[key] > 0, key
    assert res["total_s"] >= res["tokenize_s"]
    assert res["generated_tokens"] == sum(c["new_tokens"] for c in res["completions"]) > 0
    assert res["peak_memory_gib"]["max_rss_gib"] > 0.1
    assert 0 <= res["rouge1_f1"] <= 1 and res["rouge1_documents"] == 8
    assert res["prompt_tokens"]["total"] == sum(c["prompt_tokens"] for c in res["completions"])
    # the estimator's prediction for the same run (batch reached, mean prompt length, new tokens), on this CPU's
    # given rates: exactly what the estimator itself says for it
    e = res["estimator"]
    assert e["at"] == {
        "batch": 2,
        "prompt_len": round(res["prompt_tokens"]["mean"]),
        "gen_len": 6,
        "weight_dtype": "bfloat16",
    }
    assert "estimator: prefill / decode per token" in r.stdout
    from torchtitan.config.job_config import Estimate
    from torchtitan.estimate import generation_latency, resolve_hardware
    from torchtitan.models.llama3 import get_model_args

    hw = resolve_hardware(Estimate(hardware="cpu", num_devices=1, peak_tflops=0.2, hbm_bandwidth_gbps=10))
    want = generation_latency(get_model_args("debugmodel"), hw, 2, e["at"]["prompt_len"], 6)
    assert e["prefill_ms"] == pytest.approx(want.prefill_ms) and e["prefill_ms"] > 0
    assert e["decode_ms_per_token"] == pytest.approx(want.decode_ms_per_token)
    s = res["settings"]
    assert (
        s["dtype"] == "bfloat16"
        and s["max_new_tokens"] == 6
        and s["tensor_parallel"] == 1
        and s["load_s"] > 0
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--quantize=int4", "--prompt=x"], "--quantize int4 is not available on cpu"),
        (["--prompts=/nonexistent.jsonl"], "--prompts /nonexistent.jsonl does not exist"),
        (["--prompt=x", "--temperature=-1"], "--temperature -1.0 is invalid"),
        (["--prompt=x", "--model.flavor=1B"], "does not fit the model (model.flavor='1B'"),
    ],
)
def test_cli_errors_are_one_line_exit_2(checkpoint_root, args, message):
    r = generate_cli([f"--checkpoint={checkpoint_root / 'checkpoint'}", *args])
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and message in err[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cli_bad_checkpoint_and_bad_prompt_line(tmp_path):
    r = generate_cli([f"--checkpoint={tmp_path}", "--prompt=x"])
    assert r.returncode == 2 and f"error: --checkpoint {tmp_path} is not a checkpoint" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    r = generate_cli([f"--checkpoint={tmp_path}", f"--prompts={bad}"])
    assert r.returncode == 2 and f'{bad}:2: expected an object with a string "prompt"' in r.stderr


@pytest.mark.slow
def test_tensor_parallel_two_processes_gives_the_one_process_tokens(checkpoint_root, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(PROMPTS_FILE.read_text().splitlines()[:3]) + "\n")
    outs = {}
    for nproc in (1, 2):
        outs[nproc] = tmp_path / f"out{nproc}.json"
        r = generate_cli(
            [
                f"--checkpoint={checkpoint_root / 'checkpoint'}",
                f"--prompts={prompts}",
                "--max_new_tokens=12",
                "--dtype=float32",
                f"--json={outs[nproc]}",
            ],
            nproc=nproc,
        )
        assert r.returncode == 0, r.stderr
    one, two = (json.loads(outs[n].read_text()) for n in (1, 2))
    assert len(one) == 3 and one == two
    assert "tensor parallel over 2 processes" in r.stderr + r.stdout


def test_predicted_latency_says_why_when_there_is_none():
    from torchtitan.config.job_config import Estimate
    from torchtitan.generate.benchmark import predicted_latency
    from torchtitan.models.llama3 import get_model_args

    args, cpu = get_model_args("debugmodel"), torch.device("cpu")
    why = predicted_latency(Estimate(), args, cpu, 1, 1, 8, 4, "bfloat16")["unavailable"]
    assert "--estimate.peak_tflops" in why and "--estimate.hbm_bandwidth_gbps" in why
    rates = Estimate(peak_tflops=0.2, hbm_bandwidth_gbps=10)
    assert "not float32" in predicted_latency(rates, args, cpu, 1, 1, 8, 4, "float32")["unavailable"]
    int8 = predicted_latency(rates, args, cpu, 1, 1, 8, 4, "int8")
    bf16 = predicted_latency(rates, args, cpu, 1, 1, 8, 4, "bfloat16")
    assert int8["decode_ms_per_token"] < bf16["decode_ms_per_token"]  # fewer weight bytes to read per step


def test_bench_generate_script_prints_a_row_per_variant_and_batch():
    """scripts/bench_generate.py runs end to end (tiny sizes); its figures are measured, never asserted."""
    r = run_script(
        1,
        "scripts/bench_generate.py",
        [
            "--shape=debug",
            "--batch",
            "1",
            "2",
            "--repeat=1",
            "--new=3",
            "--prompt_len=4",
            "--variants",
            "ours-int8",
            "--peak_tflops=0.2",
            "--hbm_gbps=10",
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = [
        line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    header, rows = rows[0], rows[1:]
    assert "estimator predicted ms/step" in header[-1]
    assert [(c[0].strip(), c[1].strip()) for c in rows] == [
        ("1", "ours-int8"),
        ("1", "hf"),
        ("2", "ours-int8"),
        ("2", "hf"),
    ]
    for cells in rows:
        assert math.isfinite(float(cells[2])) and math.isfinite(float(cells[5]))  # measured: not asserted
        assert float(cells[-1]) > 0  # the estimator's prediction, from the given CPU rates
