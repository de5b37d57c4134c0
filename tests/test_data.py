"""Data pipeline: tokenizers, packing, sharding, determinism, exact resume, user files, errors, shipped assets."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported anywhere: nothing may be downloaded

import copy
import json
import logging
import pickle
from pathlib import Path

import pytest
import torch

from conftest import import_script
from torchtitan.data import (
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    build_dataloader,
    build_tokenizer,
    check_vocab,
)
from torchtitan.errors import UserError

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "tests" / "assets"
SP_MODEL = ASSETS / "tokenizer" / "debug.model"
TRAIN = ASSETS / "debug_corpus" / "train.jsonl"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes shifted past BOS=1/EOS=2; remembers every text it encoded (to see which documents a rank read)."""

    vocab_size, bos_id, eos_id = 259, 1, 2

    def __init__(self):
        self.seen: list[str] = []

    def _encode(self, text):
        self.seen.append(text)
        return [b + 3 for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i > 2).decode()


def docs(n, prefix="doc"):
    return [f"{prefix} {i}: " + "word " * (i % 7) + "end." for i in range(n)]


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def stream(tok, texts):
    """The BOS/EOS-framed token stream the loader packs."""
    out = []
    for t in texts:
        out += tok.encode(t, bos=True, eos=True)
    return out


def take(it, n):
    return [next(it) for _ in range(n)]


def assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.fixture(scope="module")
def sp():
    return build_tokenizer(str(SP_MODEL))


# ------------------------------------------------------------------------------------------------ tokenizers


def test_sentencepiece_ids_and_round_trip(sp):
    assert isinstance(sp, SentencePieceTokenizer)
    assert (sp.vocab_size, sp.bos_id, sp.eos_id) == (2048, 1, 2)
    text = 'Once upon a time, Lily said "hello".\n\nThe end.'
    ids = sp.encode(text, bos=True, eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1] and 2 not in ids[1:-1]
    assert sp.encode(text) == ids[1:-1]
    assert sp.decode(ids[1:-1]) == text
    # byte fallback: text the tokenizer never saw still round-trips
    odd = "naïve café — 東京 🙂 x\ty"
    assert sp.decode(sp.encode(odd)) == odd
    assert all(0 <= i < sp.vocab_size for i in sp.encode(odd))


def test_build_tokenizer_paths(tmp_path, monkeypatch):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.model").write_bytes(SP_MODEL.read_bytes())
    assert isinstance(build_tokenizer(str(tmp_path / "tok")), SentencePieceTokenizer)
    # the config's relative default resolves against the repo from any working directory
    monkeypatch.chdir(tmp_path)
    assert build_tokenizer("tests/assets/tokenizer/debug.model").vocab_size == 2048

    for bad, words in [
        (tmp_path / "missing.model", ["does not exist", "tokenizer.json"]),
        (tmp_path / "tok.txt", ["unknown file type", ".model"]),
        (tmp_path / "empty_dir", ["neither tokenizer.json nor tokenizer.model"]),
        (tmp_path / "garbage.model", ["not a readable sentencepiece model"]),
        (tmp_path / "garbage.json", ["not a readable Hugging Face tokenizer.json"]),
    ]:
        if bad.name == "empty_dir":
            bad.mkdir()
        elif bad.name != "missing.model":
            bad.write_text("not a tokenizer")
        with pytest.raises(UserError) as e:
            build_tokenizer(str(bad))
        msg = str(e.value)
        assert str(bad) in msg and "\n" not in msg
        for w in words:
            assert w in msg


def _tiny_hf_tokenizer(path, with_template=True):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers, processors

    words = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>", "the", "cat", "sat", "on", "mat", "."]
    tok = HF(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_0|>"])
    if with_template:  # like Llama 3: the post-processor adds BOS by itself; we must not get it twice
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 1)]
        )
    tok.save(str(path))
    return path


def test_hf_tokenizer_json(tmp_path):
    path = _tiny_hf_tokenizer(tmp_path / "tokenizer.json")
    tok = build_tokenizer(str(path))
    assert isinstance(tok, HFTokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (10, 1, 2)  # 9 words + one added-only special token
    ids = tok.encode("the cat sat on the mat.", bos=True, eos=True)
    assert ids == [1, 3, 4, 5, 6, 3, 7, 8, 2]
    assert tok.decode(ids[1:-1]).replace(" .", ".") == "the cat sat on the mat."
    assert isinstance(build_tokenizer(str(tmp_path)), HFTokenizer)  # a folder with tokenizer.json


def test_hf_tokenizer_config_names_bos_eos(tmp_path):
    _tiny_hf_tokenizer(tmp_path / "tokenizer.json")
    cfg = {"bos_token": {"content": "<|reserved_0|>"}, "eos_token": "<|begin_of_text|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = build_tokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id) == (9, 1)


# ------------------------------------------------------------------------------------------------ packing


def test_packing_debug_corpus_matches_reference(sp):
    seq_len, bs = 64, 3
    texts = [json.loads(line)["text"] for _, line in zip(range(40), open(TRAIN))]
    ref = stream(sp, texts)
    dl = build_dataloader("debug_corpus", None, "text", sp, 0, 1, bs, seq_len)
    batches = take(iter(dl), 8)
    n = seq_len + 1
    for b, (x, y) in enumerate(batches):
        assert (
            x.shape == y.shape == (bs, seq_len)
            and x.dtype == y.dtype == torch.int64
            and x.device.type == "cpu"
        )
        for r in range(bs):
            w = ref[(b * bs + r) * n : (b * bs + r + 1) * n]
            assert x[r].tolist() == w[:-1] and y[r].tolist() == w[1:]
    assert batches[0][0][0, 0].item() == sp.bos_id  # the stream starts with the first document's BOS


def test_wrap_around_restarts_with_epoch_warning(tmp_path, caplog):
    texts = docs(5)
    tok = ByteTokenizer()
    path = write_jsonl(tmp_path / "d.jsonl", texts)
    ref = stream(tok, texts)
    n, bs = 9, 2
    n_windows = 3 * len(ref) // n + 1  # well into the fourth pass
    dl = build_dataloader("ignored", str(path), "text", tok, 0, 1, bs, n - 1)
    with caplog.at_level(logging.WARNING):
        batches = take(iter(dl), n_windows // bs + 1)
    got = [w for x, y in batches for w in torch.cat([x, y[:, -1:]], 1).tolist()]
    endless = ref * 4  # the buffer carries over: epoch e+1's tokens follow epoch e's directly
    assert got == [endless[i * n : (i + 1) * n] for i in range(len(got))]
    assert "starting epoch 1" in caplog.text and "starting epoch 3" in caplog.text
    assert dl.state_dict()["shards"]["0"]["epoch"] == 3


def test_finite_loader_stops(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(6))
    dl = build_dataloader("x", str(path), "text", ByteTokenizer(), 0, 1, 2, 8, infinite=False)
    batches = list(dl)
    total = len(stream(ByteTokenizer(), docs(6)))
    assert len(batches) == total // 9 // 2 and list(dl) == []


# ------------------------------------------------------------------------------------------------ sharding


@pytest.mark.parametrize("world,n_files", [(2, 1), (4, 1), (2, 4), (2, 3)])
def test_ranks_see_disjoint_documents_covering_all(tmp_path, world, n_files):
    texts = docs(37)
    for f in range(
        n_files
    ):  # with a multiple of `world` files, whole files go to ranks; else 1 row in `world`
        write_jsonl(tmp_path / f"part{f}.jsonl", texts[f::n_files])
    seen = []
    for rank in range(world):
        tok = ByteTokenizer()
        list(build_dataloader("x", str(tmp_path), "text", tok, rank, world, 1, 4, infinite=False))
        assert tok.seen, f"rank {rank} read nothing"
        seen.append(set(tok.seen))
    assert sum(len(s) for s in seen) == len(texts)  # pairwise disjoint ...
    assert set().union(*seen) == set(texts)  # ... and together complete


def test_rank_with_no_documents_is_a_user_error(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", ["only document"])
    dl = build_dataloader("x", str(path), "text", ByteTokenizer(), 1, 2, 1, 4)
    with pytest.raises(
        UserError, match="no non-empty 'text' documents \\(zero tokens\\) to data-parallel rank 1 of 2"
    ):
        next(iter(dl))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n\n")  # only empty rows: an error, not an endless loop over epochs
    with pytest.raises(
        UserError, match="no non-empty 'text' documents \\(zero tokens\\) to data-parallel rank 0 of 1"
    ):
        next(iter(build_dataloader("x", str(blank), "text", ByteTokenizer(), 0, 1, 1, 4)))


# ------------------------------------------------------------------------------------------------ determinism + resume


def test_two_loaders_give_identical_batches(sp):
    a = build_dataloader("debug_corpus", None, "text", sp, 1, 2, 4, 128)
    b = build_dataloader("debug_corpus", None, "text", sp, 1, 2, 4, 128)
    assert_same(take(iter(a), 6), take(iter(b), 6))


@pytest.mark.parametrize("rank,world,k", [(0, 1, 7), (1, 2, 5), (2, 3, 1), (0, 1, 0)])
def test_exact_resume_debug_corpus(sp, rank, world, k):
    make = lambda: build_dataloader("debug_corpus", None, "text", sp, rank, world, 4, 96)  # noqa: E731
    dl = make()
    it = iter(dl)
    take(it, k)
    sd = pickle.loads(pickle.dumps(dl.state_dict()))  # what a checkpoint stores must survive serialization
    expected = take(it, 6)

    resumed = make()
    resumed.load_state_dict(sd)
    assert_same(take(iter(resumed), 6), expected)
    # an iterator made before load_state_dict follows the loaded state; state_dict before iterating is that state
    again = make()
    it_before = iter(again)
    again.load_state_dict(copy.deepcopy(sd))
    assert again.state_dict() == sd
    assert_same(take(it_before, 6), expected)


@pytest.mark.parametrize("n_files,rank,world", [(1, 0, 1), (4, 1, 2), (3, 1, 2)])
def test_exact_resume_across_epoch_boundaries(tmp_path, n_files, rank, world):
    texts = docs(18)
    for f in range(n_files):
        write_jsonl(tmp_path / f"part{f}.jsonl", texts[f::n_files])
    make = lambda: build_dataloader("x", str(tmp_path), "text", ByteTokenizer(), rank, world, 3, 10)  # noqa: E731
    ref_loader = make()
    ref = take(iter(ref_loader), 40)  # ~3 epochs
    for k in range(0, 30, 1):  # save at every batch boundary, including right before/after each wrap
        dl = make()
        take(iter(dl), k)
        sd = dl.state_dict()
        resumed = make()
        resumed.load_state_dict(sd)
        assert_same(take(iter(resumed), 40 - k), ref[k:])


def test_resume_with_other_dp_degree_is_a_user_error(sp):
    sd = build_dataloader("debug_corpus", None, "text", sp, 0, 2, 1, 8).state_dict()
    other = build_dataloader("debug_corpus", None, "text", sp, 0, 4, 1, 8)
    with pytest.raises(UserError, match="same data-parallel degree"):
        other.load_state_dict(sd)


# ------------------------------------------------------------------------------------------------ virtual shards


def _global_loaders(path, dp, k, global_bs, seq_len=10, **kw):
    """One loader per dp rank, each with its share of the global batch."""
    return [
        build_dataloader(
            "x", str(path), "text", ByteTokenizer(), r, dp, global_bs // dp, seq_len, num_shards=k, **kw
        )
        for r in range(dp)
    ]


def _global_batches(loaders, n):
    """The next n global batches: every rank's local batch, concatenated in dp-rank order."""
    its = [iter(dl) for dl in loaders]
    out = []
    for _ in range(n):
        parts = [next(it) for it in its]
        out.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
    return out


def _merged_state(loaders):
    """What a checkpoint does: the union of every rank's shard states (must survive JSON)."""
    sds = [dl.state_dict() for dl in loaders]
    merged = {"num_shards": sds[0]["num_shards"], "shards": {}}
    for sd in sds:
        assert sd["num_shards"] == merged["num_shards"] and not set(sd["shards"]) & set(merged["shards"])
        merged["shards"].update(sd["shards"])
    return json.loads(json.dumps(merged))


@pytest.mark.parametrize("n_files", [1, 4])  # one file: 1 row in K per shard; 4 files: whole files per shard
def test_virtual_shards_global_batch_independent_of_dp(tmp_path, n_files):
    texts = docs(13)  # shards of 3-4 documents: 2-3 epochs (wrapping at different steps per shard)
    for f in range(n_files):
        write_jsonl(tmp_path / f"part{f}.jsonl", texts[f::n_files])
    ref = _global_batches(_global_loaders(tmp_path, 1, 4, 8), 12)
    for dp in (2, 4):
        assert_same(_global_batches(_global_loaders(tmp_path, dp, 4, 8), 12), ref)

    # the rows are the shards' own packed streams, shard by shard: shard k gives rows 2k, 2k+1 of each batch
    n = 11
    for k in range(4):
        tok = ByteTokenizer()
        list(build_dataloader("x", str(tmp_path), "text", tok, k, 4, 1, 4, infinite=False))  # shard k's docs
        first_pass = stream(ByteTokenizer(), tok.seen)  # later epochs may reorder files: check epoch 0
        got = [w for x, y in ref for w in torch.cat([x, y[:, -1:]], 1)[2 * k : 2 * k + 2].tolist()]
        m = len(first_pass) // n
        assert m >= 2 and got[:m] == [first_pass[i * n : (i + 1) * n] for i in range(m)]
    # num_shards=None is one shard per dp rank: at dp 4 it is exactly num_shards=4
    assert_same(_global_batches(_global_loaders(tmp_path, 4, None, 8), 12), ref)


def test_virtual_shards_resume_across_dp(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", docs(13))
    ref = _global_batches(_global_loaders(tmp_path, 1, 4, 8), 14)  # uninterrupted dp-1 run
    for steps in (0, 3, 7):
        saving = _global_loaders(tmp_path, 4, 4, 8)
        assert_same(_global_batches(saving, steps), ref[:steps])
        sd = _merged_state(saving)
        assert sorted(sd["shards"]) == ["0", "1", "2", "3"]
        for dp in (2, 1, 4):
            resumed = _global_loaders(tmp_path, dp, 4, 8)
            for dl in resumed:
                dl.load_state_dict(sd)
            assert_same(_global_batches(resumed, 14 - steps), ref[steps:])


def test_virtual_shards_divisibility_and_state_errors(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(12))

    def make(rank, dp, bs, k):
        return build_dataloader("x", str(path), "text", ByteTokenizer(), rank, dp, bs, 8, num_shards=k)

    with pytest.raises(UserError) as e:
        make(0, 4, 2, 6)
    msg = str(e.value)
    assert "data.num_shards=6" in msg and "data-parallel degree 4" in msg and "multiple of 4" in msg
    with pytest.raises(UserError) as e:
        make(0, 2, 2, 8)  # 4 shards per rank cannot split a local batch of 2
    msg = str(e.value)
    assert "data.num_shards=8" in msg and "data-parallel degree 2" in msg and "local batch size 2" in msg
    assert "[2, 4]" in msg and "\n" not in msg
    with pytest.raises(UserError, match="at least 1"):
        make(0, 1, 2, 0)

    sd = make(0, 2, 2, 4).state_dict()
    assert sd["num_shards"] == 4 and sorted(sd["shards"]) == ["0", "1"]
    with pytest.raises(UserError) as e:
        make(1, 2, 2, 4).load_state_dict(sd)  # rank 1 needs shards 2 and 3
    assert "lacks shard(s) 2, 3" in str(e.value) and "merge" in str(e.value)
    with pytest.raises(UserError) as e:
        make(0, 2, 2, 2).load_state_dict(sd)
    assert "4 shards" in str(e.value) and "keep data.num_shards the same" in str(e.value)
    with pytest.raises(UserError, match="shard 3 of 4 \\(data.num_shards\\)"):
        next(
            iter(
                build_dataloader(
                    "x",
                    str(write_jsonl(tmp_path / "3.jsonl", docs(3))),
                    "text",
                    ByteTokenizer(),
                    0,
                    1,
                    4,
                    8,
                    num_shards=4,
                )
            )
        )


# ------------------------------------------------------------------------------------------------ user files


def _first_window(path, field="text"):
    tok = ByteTokenizer()
    dl = build_dataloader("ignored", str(path), field, tok, 0, 1, 1, 30)
    x, y = next(iter(dl))
    return tok.decode(x[0].tolist())


def test_user_file_formats(tmp_path):
    texts = docs(4, prefix="user")
    write_jsonl(tmp_path / "a.jsonl", texts)
    (tmp_path / "b.json").write_text(
        json.dumps([{"content": t} for t in texts])
    )  # a JSON array, other field name
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts, "n": list(range(4))}), tmp_path / "c.parquet")
    (tmp_path / "d.txt").write_text("\n".join(texts) + "\n\n")  # one document per line; blank lines skipped
    import gzip

    with gzip.open(tmp_path / "e.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in texts))

    assert _first_window(tmp_path / "a.jsonl").startswith(texts[0])
    assert _first_window(tmp_path / "b.json", field="content").startswith(texts[0])
    assert _first_window(tmp_path / "c.parquet").startswith(texts[0])
    assert _first_window(tmp_path / "d.txt").startswith(texts[0])
    assert _first_window(tmp_path / "e.jsonl.gz").startswith(texts[0])

    # a glob and a folder take every matching file, in sorted order
    sub = tmp_path / "many"
    sub.mkdir()
    write_jsonl(sub / "0.jsonl", texts[:2])
    write_jsonl(sub / "1.jsonl", texts[2:])
    for spec in (sub, sub / "*.jsonl"):
        tok = ByteTokenizer()
        list(build_dataloader("x", str(spec), "text", tok, 0, 1, 1, 8, infinite=False))
        assert tok.seen == texts


def test_bad_dataset_name_path_and_field(tmp_path, sp):
    with pytest.raises(UserError) as e:
        build_dataloader("c5", None, "text", sp, 0, 1, 1, 8)
    assert "'c5'" in str(e.value) and "c4" in str(e.value) and "debug_corpus" in str(e.value)

    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserError, match="does not exist") as e:
        build_dataloader("x", str(missing), "text", sp, 0, 1, 1, 8)
    assert str(missing) in str(e.value)

    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="matches no"):
        build_dataloader("x", str(tmp_path / "*.csv"), "text", sp, 0, 1, 1, 8)

    path = write_jsonl(tmp_path / "d.jsonl", docs(3), field="body")
    with pytest.raises(UserError) as e:
        build_dataloader("x", str(path), "text", sp, 0, 1, 1, 8)
    assert "'text'" in str(e.value) and "body" in str(e.value) and "id" in str(e.value)

    with pytest.raises(UserError, match="split 'test'"):
        build_dataloader("debug_corpus", None, "text", sp, 0, 1, 1, 8, split="test")


def test_c4_offline_is_a_user_error(sp):
    with pytest.raises(UserError, match="c4 could not be opened"):
        build_dataloader("c4", None, "text", sp, 0, 1, 1, 8)


def test_validation_split(sp):
    x, _ = next(iter(build_dataloader("debug_corpus", None, "text", sp, 0, 1, 1, 16, split="validation")))
    first = json.loads(open(ASSETS / "debug_corpus" / "validation.jsonl").readline())["text"]
    assert x[0].tolist() == sp.encode(first, bos=True)[:16]


def test_check_vocab(sp):
    check_vocab(sp, 2048, str(SP_MODEL))
    with pytest.raises(UserError) as e:
        check_vocab(sp, 128256, str(SP_MODEL))
    msg = str(e.value)
    assert "2048" in msg and "128256" in msg and str(SP_MODEL) in msg and "--model.vocab_size=2048" in msg


# ------------------------------------------------------------------------------------------------ shipped assets


def test_shipped_corpus_is_reproducible(capsys):
    make_assets = import_script("make_assets")
    assert make_assets.main(["--check", "--corpus-only", "--out", str(ASSETS)]) == 0, capsys.readouterr().out
    size = TRAIN.stat().st_size
    assert 2e6 < size < 4e6
    n_docs = sum(1 for _ in open(TRAIN))
    assert n_docs >= 3000


def test_empty_user_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="holds no records"):
        build_dataloader("debug_corpus", str(empty), "text", build_tokenizer(str(SP_MODEL)), 0, 1, 2, 16)


def test_bench_tokenizer_has_llama3_size_and_round_trips(tmp_path):
    """scripts/make_bench_tokenizer.py: a tokenizer.json the 1B-405B flavors accept (128,256 entries, Llama 3's
    BOS/EOS names), trained offline on the debug corpus, that decodes what it encodes."""
    tok = build_tokenizer(str(import_script("make_bench_tokenizer").make(tmp_path, 128256)))
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 128256
    assert {tok.bos_id, tok.eos_id} == {0, 1}
    text = 'Lily saw a fluffy rabbit.\n"Hello!" said Tom.'
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and max(ids[1:-1]) < 4096
    assert tok.decode(ids[1:-1]) == text
