"""The mini pair's synthetic verifiable task: GSM8K-like word problems with small numbers.

A problem starts from a quantity (2-99) and applies one or two steps: add or take away a number
(2-99), or add or take away ``k`` groups of ``m`` (``k, m`` in 2-9). The worked answer is a short
chain of thought that a small model can learn: times-table facts are written whole (``3*7=21``) and
additions/subtractions digit by digit, least significant first, carry or borrow folded into the
next digit::

    Q: Mia has 36 marbles. She buys 3 bags with 7 marbles each. Then Mia gives away 18
    marbles. How many marbles does Mia have now?
    A: 3*7=21. 36+21: 6+1=7, 3+2=5, so 57. 57-18: 17-8=9, 4-1=3, so 39. #### 39

The answer checker reads the integer after the first ``####``. Everything is generated from a seed,
so it needs no network.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

NAMES = ["Mia", "Leo", "Ava", "Sam", "Noah", "Zoe", "Ravi", "Lena", "Omar", "Ines", "Kai", "Nora", "Hugo",
         "Yuki", "Ada", "Tom", "Sara", "Ben", "Lily", "Max"]
ITEMS = ["marbles", "apples", "stickers", "coins", "books", "pencils", "cards", "shells", "stamps", "cookies",
         "beads", "eggs", "nails", "tickets", "buttons", "plums", "candles", "rocks", "keys", "cups"]
GROUPS = ["bags", "boxes", "packs", "jars", "rows", "bundles", "trays", "crates"]
GAIN = ["buys", "finds", "gets", "is given", "collects", "wins"]
LOSE = ["gives away", "loses", "sells", "uses", "breaks", "donates"]


@dataclass(frozen=True)
class Problem:
    """One problem: ``prompt`` ends with ``"A:"``; ``solution`` is the worked answer after it."""

    prompt: str
    solution: str
    answer: int

    @property
    def text(self) -> str:
        """The training document: prompt and worked answer."""
        return self.prompt + self.solution


def _digits(n: int, width: int) -> list[int]:
    """Digits of ``n``, least significant first, zero-padded to ``width``."""
    return [(n // 10**i) % 10 for i in range(width)]


def add_steps(a: int, b: int) -> str:
    """Digit-by-digit addition, e.g. ``add_steps(47, 38) == "47+38: 7+8=15, 4+3+1=8, so 85."``."""
    width = max(len(str(a)), len(str(b)))
    parts, carry = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width), strict=True):
        s = x + y + carry
        parts.append(f"{x}+{y}" + ("+1" if carry else "") + f"={s}")
        carry = s // 10
    return f"{a}+{b}: " + ", ".join(parts) + f", so {a + b}."


def sub_steps(a: int, b: int) -> str:
    """Digit-by-digit subtraction (``a >= b``); a borrow lowers the next digit of ``a``.

    ``sub_steps(52, 27) == "52-27: 12-7=5, 4-2=2, so 25."``
    """
    if b > a:
        raise ValueError(f"sub_steps needs a >= b, got {a} - {b}")
    width = len(str(a))
    parts, borrow = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width), strict=True):
        top = x - borrow
        borrow = 1 if top < y else 0
        top += 10 * borrow
        parts.append(f"{top}-{y}={top - y}")
    return f"{a}-{b}: " + ", ".join(parts) + f", so {a - b}."


def make_problem(rng: random.Random) -> Problem:
    """Draw one problem from ``rng``."""
    name, item, group = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(GROUPS)
    value = rng.randint(2, 99)
    sentences = [f"{name} has {value} {item}."]
    work = []
    n_steps = rng.choice([1, 2])
    for i in range(n_steps):
        then = "Then " if i else ""
        grouped = rng.random() < 0.4
        if grouped:
            k, m = rng.randint(2, 9), rng.randint(2, 9)
            amount = k * m
        else:
            amount = rng.randint(2, 99)
        gain = amount > value or (value + amount < 1000 and rng.random() < 0.5)
        if grouped:
            what = f"{k} {group} with {m} {item} each"
            work.append(f"{k}*{m}={amount}.")
        else:
            what = f"{amount} {item}"
        verb = rng.choice(GAIN if gain else LOSE)
        sentences.append(f"{then}{name} {verb} {what}.")
        work.append(add_steps(value, amount) if gain else sub_steps(value, amount))
        value = value + amount if gain else value - amount
    sentences.append(f"How many {item} does {name} have now?")
    prompt = "Q: " + " ".join(sentences) + "\nA:"
    solution = " " + " ".join(work) + f" #### {value}"
    return Problem(prompt, solution, value)


def generate(seed: int, n: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[Problem]:
    """``n`` distinct problems from ``seed``, none whose prompt is in ``exclude``."""
    rng = random.Random(seed)
    seen, out = set(exclude), []
    while len(out) < n:
        p = make_problem(rng)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


_ANSWER = re.compile(r"####\s*(-?\d+)")


def extract_answer(completion: str) -> int | None:
    """The integer after the first ``####`` in a completion, or None when there is none."""
    m = _ANSWER.search(completion)
    return int(m.group(1)) if m else None


def is_correct(completion: str, answer: int) -> bool:
    """Exact match: the completion's first ``####`` answer equals ``answer``."""
    return extract_answer(completion) == answer
