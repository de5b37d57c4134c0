"""Generate the offline test assets: a small English-like story corpus and a 2048-piece sentencepiece model.

    python scripts/make_assets.py                 # writes tests/assets/debug_corpus/*.jsonl, tests/assets/tokenizer/debug.model
                                                  # and tests/assets/prompts/debug_continuations.jsonl
    python scripts/make_assets.py --out /tmp/a    # somewhere else
    python scripts/make_assets.py --check         # regenerate into a temp dir and compare with the shipped files

Why synthetic stories: tests and the debug run must work with no network, and a 6-layer dim-256 model needs text
with real structure (recurring characters, consistent pronouns, cause -> effect, dialogue) for its loss to fall
visibly within 100 steps. Everything comes from one `random.Random(seed)` (its algorithm is stable across
Python 3 versions), so the corpus bytes are reproducible; the tokenizer is trained single-threaded on all
sentences with fixed settings so it is reproducible for a given sentencepiece version.
"""

from __future__ import annotations

import argparse
import filecmp
import io
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

SEED = 1234
NUM_TRAIN_DOCS = 4500
NUM_VALID_DOCS = 200
NUM_PROMPTS = 32  # benchmark prompts cut from the first validation stories (scripts/generate.py --benchmark)
VOCAB_SIZE = 2048

# ---------------------------------------------------------------------------------------------- word lists

GIRLS = "Lily Mia Emma Sara Anna Zoe Ella Lucy Nora Ruby Ivy Maya Rosa Alice Hannah Chloe Grace Luna Daisy Amy".split()
BOYS = "Tom Ben Max Sam Leo Jack Finn Noah Oscar Theo Hugo Eli Jake Tim Dan Luke Adam Owen Paul Milo".split()
ANIMALS = [
    ("cat", "soft"), ("dog", "friendly"), ("rabbit", "fluffy"), ("bear", "big"), ("fox", "clever"),
    ("owl", "wise"), ("mouse", "tiny"), ("duck", "yellow"), ("frog", "green"), ("pig", "pink"),
    ("lion", "brave"), ("turtle", "slow"), ("bird", "small"), ("puppy", "playful"), ("kitten", "curious"),
    ("squirrel", "quick"), ("hedgehog", "spiky"), ("deer", "gentle"), ("goat", "silly"), ("horse", "strong"),
]  # fmt: skip
PLACES = [
    ("a small house", "near the woods"), ("a big farm", "by the river"), ("a little town", "next to the sea"),
    ("a cozy cottage", "on a green hill"), ("a tall tree", "in the forest"), ("a busy city", "far from the hills"),
    ("a quiet village", "beside a lake"), ("a red barn", "behind the fields"), ("a warm cave", "under the mountain"),
    ("a blue boat", "on the calm water"), ("a sunny garden", "behind the school"), ("an old castle", "over the bridge"),
]  # fmt: skip
PLAY_SPOTS = "park garden meadow beach forest playground yard field pond hill".split()
HOBBIES = [
    "play with a ball", "draw pictures", "sing songs", "read books", "build towers with blocks", "jump in puddles",
    "look at the clouds", "pick flowers", "run around the yard", "dance in the kitchen", "fly a kite",
    "splash in the water", "climb trees", "count the stars", "bake cookies with mom", "help dad in the garden",
]  # fmt: skip
TOYS = [
    ("ball", "red"), ("kite", "blue"), ("teddy bear", "brown"), ("doll", "pretty"), ("truck", "yellow"),
    ("boat", "little"), ("hat", "green"), ("book", "old"), ("drum", "loud"), ("box", "shiny"),
    ("robot", "silver"), ("train", "long"), ("balloon", "orange"), ("crayon", "purple"), ("scarf", "warm"),
]  # fmt: skip
HIDE_SPOTS = "under the bed|behind the sofa|in the tall grass|under a big rock|inside an old box|behind a tree|" \
    "in the sand|under the table|next to the pond|on top of the shelf".split("|")  # fmt: skip
FOODS = "apples|cookies|carrots|berries|pancakes|bananas|plums|muffins|cherries|pears|grapes|nuts".split("|")
WEATHER = [
    ("rain", "it started to rain", "wet", "the sun came out again"),
    ("wind", "a strong wind began to blow", "cold", "the wind became soft and calm"),
    ("snow", "white snow began to fall", "cold", "the snow stopped and the sky was clear"),
    ("storm", "a loud storm came over the hills", "scared", "the storm went away"),
]  # fmt: skip
HELPS = [
    ("carry a heavy bag", "carried the bag together"), ("find a lost key", "looked everywhere and found the key"),
    ("fix a broken fence", "fixed the fence with a hammer"), ("reach a high shelf", "stood on a chair to reach it"),
    ("clean the messy room", "cleaned the room until it was neat"), ("water the thirsty plants", "gave every plant some water"),
]  # fmt: skip
MORALS = [
    "sharing makes everyone happy", "it is good to help your friends", "being kind is the best thing",
    "you should always tell the truth", "it is okay to ask for help", "friends make hard things easy",
    "trying again is how you learn", "a small gift can make a big smile",
]  # fmt: skip
SAYINGS_HAPPY = ["Hooray!", "Yay!", "Wow!", "This is the best day!", "I am so happy!"]
SAYINGS_SAD = ["Oh no!", "This is bad.", "What can I do?", "I feel so sad.", "Where did it go?"]
ENDINGS = [
    "From that day on, {A} and {B} were best friends.", "They played together until the sun went down.",
    "That night, {A} went to sleep with a big smile.", "And they all lived happily ever after.",
    "{A} never forgot that day.", "The end.",
]  # fmt: skip


class Character:
    def __init__(self, rng: random.Random, taken: set[str]):
        self.girl = rng.random() < 0.5
        names = [n for n in (GIRLS if self.girl else BOYS) if n not in taken]
        self.name = rng.choice(names)
        taken.add(self.name)
        self.kind, self.adj = (
            rng.choice(ANIMALS) if rng.random() < 0.5 else ("girl" if self.girl else "boy", "little")
        )
        # Consistent pronouns within a story are a learnable long-range dependency.
        self.he, self.him, self.his = ("she", "her", "her") if self.girl else ("he", "him", "his")

    @property
    def He(self):  # noqa: N802 - sentence-initial pronoun
        return self.he.capitalize()

    @property
    def His(self):  # noqa: N802
        return self.his.capitalize()


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


# ---------------------------------------------------------------------------------------------- story arcs


def _intro(rng: random.Random, a: Character) -> list[str]:
    home, where = rng.choice(PLACES)
    opener = rng.choice(["Once upon a time", "One day", "Long ago", "There once was a time when"])
    if opener == "There once was a time when":
        first = f"There once was {_a(a.adj)} {a.kind} named {a.name}."
    else:
        first = f"{opener}, there was {_a(a.adj)} {a.kind} named {a.name}."
    return [first, f"{a.He} lived in {home} {where}.", f"Every day, {a.name} liked to {rng.choice(HOBBIES)}."]


def _lost_toy(rng: random.Random, a: Character, b: Character) -> list[str]:
    toy, color = rng.choice(TOYS)
    spot = rng.choice(HIDE_SPOTS)
    return [
        f"{a.name} had {_a(color)} {toy}. {a.He} loved the {toy} very much.",
        f"One morning, {a.name} could not find the {toy}. {a.He} looked everywhere, but the {toy} was gone.",
        f'"{rng.choice(SAYINGS_SAD)}" said {a.name}. {a.He} was sad because {a.he} lost {a.his} {toy}.',
        f'Then {b.name} the {b.kind} came by. "Why are you sad?" asked {b.name}.',
        f'"I lost my {color} {toy}," said {a.name}. "I will help you," said {b.name}.',
        f"They looked together. At last, {b.name} found the {toy} {spot}.",
        f'"{rng.choice(SAYINGS_HAPPY)}" said {a.name}. {a.He} was happy because {b.name} found {a.his} {toy}.',
        f'{a.name} hugged {b.name} and said, "Thank you for helping me."',
    ]


def _sharing(rng: random.Random, a: Character, b: Character) -> list[str]:
    food = rng.choice(FOODS)
    n = rng.randint(2, 9)
    spot = rng.choice(PLAY_SPOTS)
    return [
        f"One day, {a.name} went to the {spot} with a basket of {food}.",
        f"There were {n} {food} in the basket. {a.name} wanted to eat all of them.",
        f"Then {a.he} saw {b.name} the {b.kind}. {b.name} looked hungry and sad.",
        f'"Do you want some {food}?" asked {a.name}. "Yes, please," said {b.name}.',
        f"So {a.name} gave {b.name} some {food}, and they ate them together under a tree.",
        f"{b.name} smiled. {a.name} felt warm inside because {a.he} shared with a friend.",
    ]


def _weather(rng: random.Random, a: Character, b: Character) -> list[str]:
    _, start, feel, end = rng.choice(WEATHER)
    spot = rng.choice(PLAY_SPOTS)
    hobby = rng.choice(HOBBIES)
    return [
        f"One afternoon, {a.name} and {b.name} went to the {spot} to {hobby}.",
        f"Suddenly, {start}. {a.name} felt {feel}, and {b.name} felt {feel} too.",
        f'"Let us go home," said {b.name}. "We can come back later."',
        "They ran home as fast as they could. At home, mom gave them hot soup and a warm blanket.",
        f"Soon {end}. {a.name} looked out of the window and smiled.",
        f'"Now we can go back to the {spot}," said {a.name}. And so they did.',
    ]


def _helping(rng: random.Random, a: Character, b: Character) -> list[str]:
    task, done = rng.choice(HELPS)
    return [
        f"One day, {b.name} needed to {task}, but it was too hard to do alone.",
        f'{b.name} asked, "Can someone help me?" {a.name} heard {b.him} and came to help.',
        f"First they tried and it did not work. {b.name} was tired, and {a.name} was tired too.",
        f'"Let us try again," said {a.name}. So they tried again, and this time they {done}.',
        f"{b.name} was very happy because {a.name} helped {b.him}.",
        f'"You are a good friend," said {b.name}. {a.name} felt proud.',
    ]


def _counting(rng: random.Random, a: Character, b: Character) -> list[str]:
    thing = rng.choice(["stars", "birds", "flowers", "shells", "stones", "leaves", "fish", "clouds"])
    n = rng.randint(2, 7)
    m = rng.randint(1, 5)
    return [
        f"{a.name} and {b.name} liked to count {thing}.",
        f"In the morning, {a.name} saw {n} {thing}. Then {b.name} saw {m} more {thing}.",
        f'"How many {thing} are there now?" asked {b.name}.',
        f'{a.name} thought for a moment and said, "{n} and {m} make {n + m}. There are {n + m} {thing}!"',
        f'"You are right!" said {b.name}. They laughed and kept counting until it was time for dinner.',
    ]


def _fear(rng: random.Random, a: Character, b: Character) -> list[str]:
    scary = rng.choice(["the dark", "a big dog", "the loud thunder", "the deep water", "a strange noise"])
    return [
        f"{a.name} was afraid of {scary}. Every time {a.he} thought about it, {a.he} wanted to hide.",
        f'One evening, {a.name} told {b.name} about it. "I am scared of {scary}," {a.he} said.',
        f'{b.name} held {a.his} hand. "It is okay to be scared. I will stay with you," said {b.name}.',
        f"Together they were brave. Soon {a.name} was not scared of {scary} anymore.",
        f"{a.name} learned that a friend can make you brave.",
    ]


ARCS = [_lost_toy, _sharing, _weather, _helping, _counting, _fear]


def make_story(rng: random.Random) -> str:
    taken: set[str] = set()
    a, b = Character(rng, taken), Character(rng, taken)
    sentences = _intro(rng, a)
    for arc in rng.sample(ARCS, rng.choice([1, 1, 2])):
        sentences += arc(rng, a, b)
    if rng.random() < 0.5:
        sentences.append(f"{a.name} learned that {rng.choice(MORALS)}.")
    sentences.append(rng.choice(ENDINGS).format(A=a.name, B=b.name))
    # Group sentences into short paragraphs so documents contain newlines, like real text.
    paragraphs, cur = [], []
    for s in sentences:
        cur.append(s)
        if len(cur) >= 3 and rng.random() < 0.4:
            paragraphs.append(" ".join(cur))
            cur = []
    if cur:
        paragraphs.append(" ".join(cur))
    return "\n\n".join(paragraphs)


def corpus_lines(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [json.dumps({"text": make_story(rng)}, ensure_ascii=False) for _ in range(n)]


# ---------------------------------------------------------------------------------------------- outputs


def write_corpus(out: Path) -> list[Path]:
    d = out / "debug_corpus"
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, seed, n in [
        ("train.jsonl", SEED, NUM_TRAIN_DOCS),
        ("validation.jsonl", SEED + 1, NUM_VALID_DOCS),
    ]:
        p = d / name
        p.write_text("\n".join(corpus_lines(seed, n)) + "\n", encoding="utf-8")
        paths.append(p)
    return paths


# A sentence ends at . ! ? (possibly inside a closing quote) before whitespace and a capital or an opening quote.
_SENTENCE_BREAK = re.compile(r'(?<=[.!?])\s+(?=[A-Z"])')


def write_prompts(valid_jsonl: Path, out: Path) -> Path:
    """Benchmark prompts: each story cut at the sentence break nearest its middle; the first half is the prompt,
    the rest of the story the reference its continuation is scored against (ROUGE-1)."""
    d = out / "prompts"
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for line in valid_jsonl.read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        breaks = list(_SENTENCE_BREAK.finditer(text))
        if len(breaks) < 3:
            continue
        cut = min(breaks, key=lambda m: abs(m.start() - len(text) / 2))
        rows.append(json.dumps({"prompt": text[: cut.start()], "reference": text[cut.end() :]}))
        if len(rows) == NUM_PROMPTS:
            break
    p = d / "debug_continuations.jsonl"
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return p


def train_tokenizer(train_jsonl: Path, out: Path) -> Path:
    import sentencepiece as spm

    tok_dir = out / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)

    def sentences():  # sentencepiece wants one sentence per line: feed it the documents' paragraphs
        with open(train_jsonl, encoding="utf-8") as f:
            for line in f:
                yield from (para for para in json.loads(line)["text"].split("\n") if para)

    model = io.BytesIO()  # an in-memory writer keeps temp paths out of the model's stored trainer_spec
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        character_coverage=1.0,
        # identity normalization + kept whitespace + byte fallback (as Llama 2 did): decode(encode(s)) == s for
        # any string, including newlines and characters never seen in training.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        byte_fallback=True,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        # Reproducibility: every sentence, no sampling/shuffling, one thread.
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    (tok_dir / "debug.model").write_bytes(model.getvalue())
    return tok_dir / "debug.model"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "assets"))
    p.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with --out")
    p.add_argument("--corpus-only", action="store_true", help="skip tokenizer training (fast)")
    args = p.parse_args(argv)
    out = Path(args.out)

    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            ok = True
            corpus = write_corpus(Path(tmp))
            for new in [*corpus, write_prompts(corpus[1], Path(tmp))]:
                old = out / new.parent.name / new.name
                same = old.exists() and filecmp.cmp(new, old, shallow=False)
                ok &= same
                print(f"{'ok' if same else 'DIFFERENT'}: {old}")
            if not args.corpus_only:
                new = train_tokenizer(Path(tmp) / "debug_corpus" / "train.jsonl", Path(tmp))
                old = out / "tokenizer" / "debug.model"
                same = old.exists() and filecmp.cmp(new, old, shallow=False)
                # A different sentencepiece version may train a slightly different model: report, don't fail.
                print(f"{'ok' if same else 'different (sentencepiece version?)'}: {old}")
        return 0 if ok else 1

    t0 = time.perf_counter()
    train, valid = write_corpus(out)
    prompts = write_prompts(valid, out)
    model = train_tokenizer(train, out)
    for path in (train, valid, prompts, model):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
