"""Local data for the SmolLM2 pair: prose, instruction prompts (train / held-out) and a small verifiable task.

Sources:

- code: the running interpreter's standard library, split by :mod:`dimr.zoo.corpus` (held-out files are
  ``data/heldout_code.jsonl``, shared with the mini pair);
- prose: *Botchan (Master Darling)* by Natsume Sōseki, tr. Yasotaro Morri (1919), Project Gutenberg eBook
  #8868, public domain in the USA. It is read from ``test/botchan.txt`` in the source distribution of the
  PyPI package ``sentencepiece`` 0.2.3 (Apache-2.0; ``pip download --no-deps --no-binary :all:
  sentencepiece==0.2.3``); the Project Gutenberg header and licence footer are cut off and the text is split
  into chunks of about 600 characters, held out by a hash of the chunk's number;
- prompts: written here (task and topic lists below) or built from train/held-out chunks of both sources,
  in SmolLM2's chat template (with its default system prompt). Every third written task/topic is held out;
- task: single-step addition word problems from :mod:`dimr.zoo.task`'s vocabulary, answered in SmolLM2's own
  format (the checker reads the last integer of the answer).

``python -m dimr.zoo.smollm2_data --sdist sentencepiece-0.2.3.tar.gz`` rewrites the shipped files under
``dimr/zoo/data/smollm2`` (without ``--sdist`` it runs ``pip download`` for it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from dimr.zoo import DATA_DIR

SMOLLM2_DATA = DATA_DIR / "smollm2"
SDIST = "sentencepiece==0.2.3"
BOTCHAN_MEMBER = "sentencepiece-0.2.3/test/botchan.txt"
BOTCHAN_SHA256 = "464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7"
HELDOUT_FRACTION = 0.2
TASK_MAX = 9  # measured (greedy, dimr.zoo.smollm2_eval task): 2-99 3.3 %, 2-20 18.3 %, 2-9 21.7 %
CHUNK_CHARS = 600

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "computes the factorial of n", "counts the vowels in a string", "checks whether a string is a palindrome",
    "merges two sorted lists into one sorted list", "removes duplicates from a list while keeping order",
    "finds the largest element of a list", "flattens a nested list",
    "computes the greatest common divisor of two numbers",
    "converts Celsius to Fahrenheit", "counts the words in a text", "returns the second largest number in a list",
    "sorts a list of dictionaries by a given key", "reads a CSV file and returns its rows", "implements binary search",
    "implements bubble sort", "implements merge sort", "implements quicksort",
    "checks whether two strings are anagrams",
    "returns the sum of the digits of an integer", "converts a decimal number to binary",
    "finds all prime numbers below n", "transposes a matrix", "multiplies two matrices",
    "computes the mean, median and mode of a list", "capitalizes the first letter of every word",
    "checks whether a year is a leap year", "returns the common elements of two lists",
    "groups a list of words by their first letter", "computes the Levenshtein distance of two strings",
    "validates an email address with a regular expression", "parses a date string into a datetime object",
    "counts how often each character occurs in a string", "rotates a list by k positions",
    "finds the longest common prefix of a list of strings", "checks whether brackets in a string are balanced",
    "implements a stack class with push, pop and peek", "implements a queue using two stacks",
    "returns the n largest items of a list", "computes the power set of a set", "generates all permutations of a list",
    "converts a Roman numeral to an integer", "converts an integer to a Roman numeral",
    "computes the running average of a list", "finds the missing number in a list from 1 to n",
    "splits a list into chunks of size n", "reads a JSON file and returns a dictionary",
    "writes a list of lines to a text file", "returns the file names in a directory",
    "computes the area of a circle", "implements a simple linked list", "reverses a linked list",
    "checks whether a binary tree is balanced", "computes the depth of a binary tree",
    "performs a breadth-first search on a graph", "performs a depth-first search on a graph",
    "finds the shortest path with Dijkstra's algorithm", "implements a least-recently-used cache",
    "counts the lines of a file", "removes punctuation from a string", "finds the most common word in a text",
    "computes compound interest", "checks whether a number is a perfect square", "returns the divisors of a number",
    "computes the sum of a list without using sum()", "zips two lists into a dictionary",
    "inverts a dictionary", "checks whether a list is sorted", "returns the index of the minimum value",
    "implements insertion sort", "implements selection sort", "computes the dot product of two vectors",
    "normalizes a list of numbers to the range 0 to 1", "converts a string to snake_case",
    "converts a string to camelCase", "truncates a string to n characters with an ellipsis",
    "checks whether a number is an Armstrong number", "finds pairs in a list that sum to a target",
    "computes the cumulative sum of a list", "formats a number with thousands separators",
    "returns the current date as a string", "measures how long a function takes to run",
    "retries a function call up to three times", "parses command-line arguments with argparse",
    "downloads a web page with urllib", "encodes a string in base64", "hashes a password with hashlib",
    "generates a random password", "shuffles a list in place", "simulates rolling two dice",
    "computes the distance between two points", "checks whether a point lies inside a rectangle",
    "counts the occurrences of a value in a nested list", "merges two dictionaries",
    "finds the intersection of several sets", "converts a list of tuples into a dictionary",
    "removes empty strings from a list", "returns the longest word in a sentence",
    "checks whether a string contains only digits", "pads a number with leading zeros",
]

PROSE_TOPICS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works in simple terms.", "Describe a busy morning market in a small town.",
    "Write a letter to a friend about your summer holiday.", "Explain why the sky is blue.",
    "Write a short poem about the autumn rain.", "Describe the life cycle of a butterfly.",
    "Explain the difference between weather and climate.", "Write a short story about a robot learning to paint.",
    "Give three tips for studying more effectively.", "Describe your ideal weekend.",
    "Explain how a bicycle works.", "Write a fable about a fox and a crow.",
    "Explain what inflation is to a teenager.", "Describe a thunderstorm at night.",
    "Write a short story about a child who gets lost in a museum.", "Explain how vaccines protect us.",
    "Write a paragraph about the importance of sleep.", "Describe the view from a mountain top.",
    "Explain how the water cycle works.", "Write a diary entry of a sailor on a long voyage.",
    "Give advice to someone starting their first job.", "Explain the rules of chess briefly.",
    "Describe a cozy library on a winter evening.", "Write a short story about a dragon who is afraid of fire.",
    "Explain why exercise is good for health.", "Write a product description for a handmade wooden chair.",
    "Describe how bread is baked.", "Explain what a black hole is.", "Write a thank-you note to a teacher.",
    "Describe the history of the printing press in a few sentences.", "Explain how bees make honey.",
    "Write a short story about two neighbours who never spoke.", "Give five ideas for a rainy day.",
    "Explain what democracy means.", "Describe a walk along the beach at sunset.",
    "Write a short speech for a school graduation.", "Explain how the moon affects the tides.",
    "Write a short story about a cat who wants to fly.", "Explain the benefits of reading books.",
    "Describe a train journey through the countryside.", "Explain how a rainbow forms.",
    "Write a review of an imaginary restaurant.", "Explain what recycling is and why it matters.",
    "Write a short story about an old clockmaker.", "Describe the four seasons in a temperate country.",
    "Explain how the heart pumps blood.", "Write a short mystery story set in a hotel.",
    "Give advice on how to make new friends.", "Explain what gravity is.",
    "Describe a festival in a city of your choice.", "Write a short story about a girl who talks to trees.",
    "Explain how electricity reaches our homes.", "Write an email asking for a meeting.",
    "Describe the smell and sounds of a forest.", "Explain why people travel.",
    "Write a short story about a baker's apprentice.", "Explain how plants grow from seeds.",
    "Describe a day in the life of a farmer.", "Explain the importance of friendship.",
    "Write a short adventure story on a desert island.", "Explain how the internet works in simple terms.",
    "Describe an old castle on a hill.", "Write a short story about a musician who loses her voice.",
    "Explain what a volcano is.", "Give tips for saving money.", "Describe a snowy village at Christmas.",
    "Explain how airplanes stay in the air.", "Write a short story about a time traveller.",
    "Explain the causes of earthquakes.", "Describe your favourite meal and how it is made.",
    "Write a short story about a boy and his grandfather fishing.", "Explain what a healthy diet is.",
    "Describe a crowded railway station.", "Write a short poem about the sea.",
    "Explain why we have day and night.", "Write a short story about a lost dog finding its way home.",
    "Explain how a library is organised.", "Describe a garden in spring.", "Explain what a computer does.",
    "Write a short story about a village that wakes up to find the river gone.",
    "Explain why honesty is important.", "Describe a visit to the zoo.",
    "Write a short story about an astronaut alone on the moon.", "Explain how clouds form.",
    "Give advice to a new student at a school.", "Describe an old photograph of a family.",
    "Explain what the stock market is.", "Write a short story about a painter and a mysterious model.",
    "Explain how bridges are built.", "Describe a quiet morning in a big city.",
    "Write a short story about a teacher in a mountain school.", "Explain why forests are important.",
    "Describe a football match from the view of a fan.", "Explain how the human eye sees colours.",
    "Write a short story about two sisters running a bookshop.",
]

PROSE_TEMPLATES = [
    "Continue this passage from a novel:\n\n{chunk}",
    "Summarize the following passage in a few sentences:\n\n{chunk}",
    "Rewrite the following passage in modern, simple English:\n\n{chunk}",
]
CODE_TEMPLATES = [
    "Explain what the following Python code does:\n\n```python\n{chunk}```",
    "Complete the following Python code:\n\n```python\n{chunk}```",
    "Add docstrings and comments to the following Python code:\n\n```python\n{chunk}```",
]
# Training-only instruction prompts, combined from these lists (held-out prompts never come from them).
STORY_WHO = ["a young fisherman", "an old librarian", "a shy robot", "a travelling musician", "a curious fox",
             "a retired sea captain", "a girl who loves maps", "a baker in a small village", "a lonely giant",
             "a detective with a bad memory", "a boy who can talk to birds", "a gardener", "a tired postman",
             "a brave little mouse", "a king who lost his crown", "two friends on a road trip", "a clever crow",
             "a nurse on a night shift", "an inventor", "a family of hedgehogs"]
STORY_WHAT = ["finds a hidden door", "has to cross a frozen lake", "receives a mysterious letter",
              "wakes up in a different century", "wants to win a race", "loses something precious",
              "meets a stranger on a train", "discovers a secret garden", "has to keep a promise",
              "gets caught in a storm", "learns a new language", "finds a map to a treasure",
              "opens a small shop", "helps a lost child", "builds a boat", "is afraid of the dark"]
CONCEPTS = ["the solar system", "the human brain", "renewable energy", "the immune system", "evaporation",
            "the food chain", "magnetism", "the French Revolution", "supply and demand", "the Roman Empire",
            "climate change", "the theory of evolution", "nuclear energy", "the internet of things", "sound waves",
            "the carbon cycle", "artificial intelligence", "the Great Wall of China", "global trade", "friction",
            "the printing of money",
            "ocean currents", "the digestive system", "electric cars", "photosynthesis in algae",
            "the metric system", "the Olympic Games", "democracy in ancient Athens", "coral reefs", "the seasons",
            "interest rates", "the history of writing", "bacteria", "the speed of light", "deserts", "glaciers",
            "the stock exchange", "human memory", "solar panels", "the invention of the telephone"]
CONCEPT_TEMPLATES = ["Explain {x} in simple terms.", "Write a short paragraph about {x}.",
                     "What is important to know about {x}?", "Explain {x} to a ten-year-old."]
PLACES = ["a quiet harbour at dawn", "a mountain village in winter", "a busy airport", "an abandoned factory",
          "a rainforest after the rain", "a small bakery", "a city park in autumn", "a desert at night",
          "an old bookshop", "a school playground", "a fishing boat", "a crowded concert hall",
          "a farm in summer", "a hospital waiting room", "a frozen lake", "a street market in the evening",
          "a lighthouse in a storm", "a tiny apartment", "a train station at midnight", "a field of sunflowers"]
PLACE_TEMPLATES = ["Describe {x}.", "Write a short poem about {x}.", "Write a paragraph set in {x}."]
ADVICE = ["learning to cook", "staying healthy", "writing a good essay", "keeping a garden", "travelling on a budget",
          "learning a musical instrument", "speaking in public", "getting up early", "working from home",
          "taking care of a dog", "reading more books", "preparing for an exam", "making a good first impression",
          "saving energy at home", "planning a birthday party"]
ADVICE_TEMPLATES = ["Give some tips for {x}.", "What is the best way to start {x}?"]
LETTERS = ["Write a short letter to a neighbour about a noisy party.", "Write an email to a colleague asking for help.",
           "Write a short note to thank a friend for a gift.", "Write a complaint letter about a late delivery.",
           "Write an invitation to a school concert.", "Write a short apology to a friend for missing a dinner.",
           "Write a letter to your future self.", "Write an email to a landlord about a broken heater."]
EXTRA_CODE_REQUESTS = ["Write a short Python script that {task}, and explain how it works.",
                       "Show me a Python function that {task}."]


def extra_train_prompts(seed: int, heldout: set[str]) -> list[dict]:
    """Training-only prompts combined from the lists above (about 640), none equal to a held-out prompt."""
    rng = random.Random(seed)
    prose = [f"Write a short story about {w} who {t}." for w in STORY_WHO for t in STORY_WHAT]
    prose = rng.sample(prose, 160)
    prose += [t.format(x=x) for x in CONCEPTS for t in CONCEPT_TEMPLATES]
    prose += [t.format(x=x) for x in PLACES for t in PLACE_TEMPLATES]
    prose += [t.format(x=x) for x in ADVICE for t in ADVICE_TEMPLATES] + LETTERS
    code = [t.format(task=task) for i, task in enumerate(CODE_TASKS) if i % 3 for t in EXTRA_CODE_REQUESTS]
    rows = [{"kind": "prose", "prompt": p} for p in prose] + [{"kind": "code", "prompt": p} for p in code]
    return [r for r in rows if r["prompt"] not in heldout]


CODE_REQUESTS = ["Write a Python function that {task}.", "Write Python code that {task}, with an example.",
                 "How do I write a Python function that {task}?"]


def _hash_fraction(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16**8


def botchan_text(raw: str) -> str:
    """The novel's text: Gutenberg header and footer cut, lines joined into paragraphs of running text."""
    start = raw.index("*** START OF THIS PROJECT GUTENBERG EBOOK")
    end = raw.index("*** END OF THIS PROJECT GUTENBERG EBOOK")
    body = raw[raw.index("\n", start) + 1:end]
    body = body[body.index("CHAPTER I"):]
    lines = [ln.strip() for ln in body.splitlines()]
    out, cur = [], []
    for ln in lines:
        if re.fullmatch(r"CHAPTER [IVX]+\.?", ln):
            if cur:
                out.append(" ".join(cur))
            cur = []
            out.append(ln)
        elif ln:
            cur.append(ln)
    if cur:
        out.append(" ".join(cur))
    return "\n\n".join(out) + "\n"


def prose_chunks(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Split prose at sentence ends into pieces of at most about ``max_chars`` characters."""
    sentences = re.split(r"(?<=[.!?\"])\s+", text.replace("\n\n", " "))
    pieces, cur = [], ""
    for s in sentences:
        if re.fullmatch(r"CHAPTER [IVX]+\.?", s.strip()):
            continue
        s = re.sub(r"^CHAPTER [IVX]+\.?\s*", "", s)
        if cur and len(cur) + len(s) + 1 > max_chars:
            pieces.append(cur)
            cur = ""
        cur = f"{cur} {s}".strip()
    if cur:
        pieces.append(cur)
    return pieces


def split_prose(chunks: list[str]) -> tuple[list[str], list[str]]:
    train, heldout = [], []
    for i, c in enumerate(chunks):
        (heldout if _hash_fraction(f"botchan:{i}") < HELDOUT_FRACTION else train).append(c)
    return train, heldout


def read_botchan(sdist: Path | None = None) -> str:
    """The raw Botchan file from the sentencepiece sdist (``pip download`` when no path is given)."""
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            SDIST, "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("sentencepiece-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            raw = tar.extractfile(BOTCHAN_MEMBER).read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != BOTCHAN_SHA256:
        raise RuntimeError(f"{BOTCHAN_MEMBER} has sha256 {digest}, expected {BOTCHAN_SHA256}")
    return raw.decode("utf-8-sig")


def _code_snippets(files: list[tuple[str, str]], rng: random.Random, n: int, max_chars: int = 500) -> list[str]:
    from dimr.zoo.corpus import chunk

    pool = [c for _, text in files for c in chunk(text, max_chars) if 120 < len(c) <= max_chars + 200]
    return rng.sample(pool, min(n, len(pool)))


def chat(tok, user: str) -> str:
    """``user`` as a SmolLM2 chat prompt (default system prompt, generation prompt added)."""
    return tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)


def build_prompts(prose_train: list[str], prose_heldout: list[str], seed: int = 0,
                  n_train_snippets: int = 500) -> tuple[list[dict], list[dict]]:
    """(train, held-out) user prompts: ``{"kind": "code"|"prose", "prompt": ...}``; held-out has 48 of each."""
    from dimr.zoo.corpus import split_files

    rng = random.Random(seed)
    code_train_files, code_heldout_files = split_files(0.1)
    train, heldout = [], []
    for i, task in enumerate(CODE_TASKS):
        dest = heldout if i % 3 == 0 else train
        templates = CODE_REQUESTS[:1] if dest is heldout else CODE_REQUESTS
        dest.extend({"kind": "code", "prompt": t.format(task=task)} for t in templates)
    for i, topic in enumerate(PROSE_TOPICS):
        (heldout if i % 3 == 0 else train).append({"kind": "prose", "prompt": topic})
    code_h = [p for p in heldout if p["kind"] == "code"]
    prose_h = [p for p in heldout if p["kind"] == "prose"]
    n_code_h, n_prose_h = 48 - len(code_h), 48 - len(prose_h)
    heldout = code_h[:48] + [
        {"kind": "code", "prompt": rng.choice(CODE_TEMPLATES).format(chunk=c)}
        for c in _code_snippets(code_heldout_files, rng, max(n_code_h, 0))
    ] + prose_h[:48] + [
        {"kind": "prose", "prompt": rng.choice(PROSE_TEMPLATES).format(chunk=c)}
        for c in rng.sample(prose_heldout, max(n_prose_h, 0))
    ]
    train += [{"kind": "code", "prompt": rng.choice(CODE_TEMPLATES).format(chunk=c)}
              for c in _code_snippets(code_train_files, rng, n_train_snippets)]
    train += [{"kind": "prose", "prompt": rng.choice(PROSE_TEMPLATES).format(chunk=c)}
              for c in rng.sample(prose_train, min(n_train_snippets, len(prose_train)))]
    train += extra_train_prompts(seed + 7, {p["prompt"] for p in heldout})
    return train, heldout


def addition_problems(seed: int, n: int, hi: int = TASK_MAX) -> list[dict]:
    """Single-step addition word problems (numbers 2 to ``hi``), asked as a chat question."""
    from dimr.zoo.task import GAIN, ITEMS, NAMES

    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        a, b = rng.randint(2, hi), rng.randint(2, hi)
        q = (f"{name} has {a} {item}. {name} {rng.choice(GAIN)} {b} more {item}. "
             f"How many {item} does {name} have now?")
        if q not in seen:
            seen.add(q)
            out.append({"question": q, "answer": a + b})
    return out


_INT = re.compile(r"-?\d[\d,]*")
_HASHES = re.compile(r"####\s*(-?\d[\d,]*)")


def integers(text: str) -> list[int]:
    """Every integer written in ``text`` (thousands separators allowed), in order."""
    return [int(x.replace(",", "")) for x in _INT.findall(text)]


def task_answer(completion: str) -> int | None:
    """The integer after the first ``####`` (SmolLM2 often answers GSM8K-style), else the last integer."""
    m = _HASHES.search(completion)
    if m:
        return int(m.group(1).replace(",", ""))
    found = integers(completion)
    return found[-1] if found else None


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build(out: Path = SMOLLM2_DATA, sdist: Path | None = None, seed: int = 0, task_max: int = TASK_MAX) -> None:
    from transformers import AutoTokenizer

    from dimr.gguf import smollm2_checkpoint

    tok = AutoTokenizer.from_pretrained(smollm2_checkpoint())
    prose_train, prose_heldout = split_prose(prose_chunks(botchan_text(read_botchan(sdist))))
    train, heldout = build_prompts(prose_train, prose_heldout, seed)
    write_jsonl(out / "prose_train.jsonl", [{"text": t} for t in prose_train])
    write_jsonl(out / "prose_heldout.jsonl", [{"text": t} for t in prose_heldout])
    write_jsonl(out / "prompts_train.jsonl", [{**p, "text": chat(tok, p["prompt"])} for p in train])
    write_jsonl(out / "prompts_heldout.jsonl", [{**p, "text": chat(tok, p["prompt"])} for p in heldout])
    write_jsonl(out / "task_addition.jsonl", [{**p, "text": chat(tok, p["question"])}
                                              for p in addition_problems(seed + 13, 60, task_max)])
    (out / "sources.json").write_text(json.dumps(SOURCES, indent=1) + "\n")
    write_hashes(out)


SOURCES = {
    "prose_train.jsonl, prose_heldout.jsonl": {
        "work": "Botchan (Master Darling), Natsume Soseki (Kin-nosuke Natsume), tr. Yasotaro Morri, rev. "
                "J. R. Kennedy, 1919",
        "edition": "Project Gutenberg eBook #8868 (header and licence footer removed)",
        "licence": "public domain in the USA",
        "read_from": f"{BOTCHAN_MEMBER} in the PyPI source distribution {SDIST} (package licence Apache-2.0)",
        "sha256": BOTCHAN_SHA256,
        "split": f"chunks of about {CHUNK_CHARS} characters, held out when sha256('botchan:<index>') < "
                 f"{HELDOUT_FRACTION}",
    },
    "code": "the running interpreter's standard library, split by dimr.zoo.corpus (held-out files: "
            "data/heldout_code.jsonl)",
    "prompts_train.jsonl, prompts_heldout.jsonl": "written in dimr/zoo/smollm2_data.py (every third task or "
            "topic held out) or built from train/held-out code and prose chunks; field text is the SmolLM2 "
            "chat prompt",
    "task_addition.jsonl": "single-step addition word problems (dimr.zoo.smollm2_data.addition_problems)",
    "builder": "python -m dimr.zoo.smollm2_data [--sdist sentencepiece-0.2.3.tar.gz]",
}


def write_hashes(out: Path = SMOLLM2_DATA) -> dict[str, str]:
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(out.iterdir()) if p.suffix in (".jsonl", ".json") and p.name != "hashes.json"}
    (out / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    return hashes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdist", type=Path, help="sentencepiece-0.2.3.tar.gz (else pip download it)")
    ap.add_argument("--out", type=Path, default=SMOLLM2_DATA)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    build(args.out, args.sdist, args.seed)


if __name__ == "__main__":
    main()
