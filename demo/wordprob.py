"""English word problems (GSM8K-style) for the demo models.

These are *open* requests: there is no task grammar and no rule set for them on the
serving path (they are not in ``coinfer.tasks``); the grade below is used only by the
demo's training report and the benchmarks.

Prompt:    ``Natalia sold 48 clips in April, and then she sold half as many clips in May. ...``
Solution:  one line per step with an explicit equation ``a op b = c`` (ops among ``+ - * /``,
           spaces around them), then ``Answer: N``::

               In May Natalia sold 48 / 2 = 24 clips.
               Altogether she sold 48 + 24 = 72 clips.
               Answer: 72

Numbers are small (results below ~100, integer division exact) so that tiny models can
learn them; the held-out split is the fixed one of ``coinfer.tasks.is_held_out``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from coinfer.tasks import is_held_out

TASK = "words"


@dataclass(frozen=True)
class WordProblem:
    prompt: str
    solution: str
    answer: int


NAMES = (
    ("Natalia", "she", "her"),
    ("James", "he", "his"),
    ("Maria", "she", "her"),
    ("Tom", "he", "his"),
    ("Aisha", "she", "her"),
    ("Liam", "he", "his"),
    ("Sofia", "she", "her"),
    ("Omar", "he", "his"),
    ("Emma", "she", "her"),
    ("Ben", "he", "his"),
    ("Yuki", "she", "her"),
    ("Carlos", "he", "his"),
    ("Grace", "she", "her"),
    ("Noah", "he", "his"),
    ("Priya", "she", "her"),
    ("Leo", "he", "his"),
)
ITEMS = (
    "apples",
    "pencils",
    "stickers",
    "cookies",
    "marbles",
    "books",
    "cards",
    "eggs",
    "clips",
    "shells",
    "stamps",
    "candies",
    "flowers",
    "toys",
    "coins",
    "cupcakes",
)
# (past, base) pairs for "how many did X <base>"
VERBS = (
    ("sold", "sell"),
    ("baked", "bake"),
    ("collected", "collect"),
    ("picked", "pick"),
    ("made", "make"),
    ("found", "find"),
    ("bought", "buy"),
    ("painted", "paint"),
)
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
CONTAINERS = ("box", "bag", "jar", "basket", "crate", "tray")


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _eq(a: int, op: str, b: int) -> tuple[str, int]:
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    return f"{a} {op} {b} = {c}", c


def _who(rng: random.Random, k: int = 1) -> list[tuple[str, str, str]]:
    return rng.sample(NAMES, k)


# Each template: rng -> (prompt, [step lines], answer). Step lines hold "a op b = c".
def _t_half(rng):
    ((n, p, pos),) = _who(rng)
    past, base = rng.choice(VERBS)
    items = rng.choice(ITEMS)
    m1 = rng.randrange(len(MONTHS) - 1)
    a = 2 * rng.randint(2, 24)
    e1, b = _eq(a, "/", 2)
    e2, c = _eq(a, "+", b)
    prompt = (
        f"{n} {past} {a} {items} in {MONTHS[m1]}, and then {p} {past} half as many {items} in "
        f"{MONTHS[m1 + 1]}. How many {items} did {n} {base} altogether?"
    )
    return prompt, [f"In {MONTHS[m1 + 1]} {n} {past} {e1} {items}.", f"Altogether {p} {past} {e2} {items}."], c


def _t_packs(rng):
    ((n, p, pos),) = _who(rng)
    items = rng.choice(ITEMS)
    a, b, c = rng.randint(1, 30), rng.randint(2, 6), rng.randint(2, 9)
    e1, d = _eq(b, "*", c)
    e2, e = _eq(a, "+", d)
    prompt = (
        f"{n} has {a} {items}. {_cap(p)} buys {b} packs with {c} {items} in each pack. "
        f"How many {items} does {n} have now?"
    )
    return prompt, [f"{n} buys {e1} {items}.", f"Now {p} has {e2} {items}."], e


def _t_give_buy(rng):
    (n, p, pos), (n2, _, _) = _who(rng, 2)
    items = rng.choice(ITEMS)
    a = rng.randint(10, 50)
    b, c = rng.randint(1, a - 1), rng.randint(1, 30)
    e1, d = _eq(a, "-", b)
    e2, e = _eq(d, "+", c)
    prompt = (
        f"{n} had {a} {items}. {_cap(p)} gave {b} {items} to {n2} and then bought {c} more. "
        f"How many {items} does {n} have now?"
    )
    return prompt, [f"After giving some away {n} has {e1} {items}.", f"After buying more {p} has {e2} {items}."], e


def _t_share(rng):
    ((n, p, pos),) = _who(rng)
    items = rng.choice(ITEMS)
    b, d = rng.randint(2, 6), rng.randint(2, 10)
    a = b * d
    c = rng.randint(1, d)
    verb = rng.choice(("eats", "gives away", "loses", "uses"))
    e1, _ = _eq(a, "/", b)
    e2, e = _eq(d, "-", c)
    prompt = (
        f"{n} shares {a} {items} equally among {b} friends. Each friend then {verb} {c} of them. "
        f"How many {items} does each friend have left?"
    )
    return prompt, [f"Each friend gets {e1} {items}.", f"Each friend has {e2} {items} left."], e


def _t_boxes(rng):
    ((n, p, pos),) = _who(rng)
    items, box = rng.choice(ITEMS), rng.choice(CONTAINERS)
    a, b, c = rng.randint(2, 9), rng.randint(2, 8), rng.randint(1, 9)
    e1, d = _eq(b, "*", a)
    e2, e = _eq(d, "+", c)
    boxes = box + ("es" if box.endswith("x") else "s")
    prompt = (
        f"A {box} holds {a} {items}. {n} fills {b} {boxes} and has {c} {items} left over. "
        f"How many {items} does {n} have in total?"
    )
    return prompt, [f"The {boxes} hold {e1} {items}.", f"In total {n} has {e2} {items}."], e


def _t_wage(rng):
    ((n, p, pos),) = _who(rng)
    d1 = rng.randrange(len(DAYS) - 1)
    a, b, c = rng.randint(2, 9), rng.randint(1, 6), rng.randint(1, 6)
    e1, d = _eq(b, "+", c)
    e2, e = _eq(a, "*", d)
    job = rng.choice(("at the shop", "in the garden", "at the cafe", "as a tutor", "at the library"))
    prompt = (
        f"{n} earns {a} dollars per hour {job}. {_cap(p)} works {b} hours on {DAYS[d1]} and {c} hours "
        f"on {DAYS[d1 + 1]}. How many dollars does {n} earn in total?"
    )
    return prompt, [f"{n} works {e1} hours.", f"{_cap(p)} earns {e2} dollars."], e


def _t_pages(rng):
    ((n, p, pos),) = _who(rng)
    a, b = rng.randint(2, 9), rng.randint(2, 7)
    d = a * b
    c = d + rng.randint(1, 40)
    e1, _ = _eq(a, "*", b)
    e2, e = _eq(c, "-", d)
    prompt = (
        f"{n} reads {a} pages every day for {b} days. {_cap(pos)} book has {c} pages. "
        f"How many pages does {n} still have to read?"
    )
    return prompt, [f"{n} reads {e1} pages.", f"There are {e2} pages left."], e


def _t_change(rng):
    ((n, p, pos),) = _who(rng)
    items = rng.choice(ITEMS)
    a, b = rng.randint(2, 8), rng.randint(1, 9)
    d = a * b
    c = rng.choice([x for x in (10, 20, 50, 100) if x >= d])
    e1, _ = _eq(a, "*", b)
    e2, e = _eq(c, "-", d)
    prompt = (
        f"{n} buys {a} {items} for {b} dollars each and pays with a {c} dollar bill. "
        f"How many dollars of change does {n} get?"
    )
    return prompt, [f"The {items} cost {e1} dollars.", f"The change is {e2} dollars."], e


def _t_bags(rng):
    ((n, p, pos),) = _who(rng)
    items = rng.choice(ITEMS)
    k, f = rng.randint(2, 5), rng.randint(2, 9)
    e_total = k * f
    c = rng.randint(1, 12)
    d = e_total + c
    a = rng.randint(1, d - 1)
    b = d - a
    c1, c2 = rng.sample(("red", "blue", "green", "yellow", "small", "big"), 2)
    e1, _ = _eq(a, "+", b)
    e2, _ = _eq(d, "-", c)
    e3, _ = _eq(e_total, "/", k)
    prompt = (
        f"{n} has {a} {c1} {items} and {b} {c2} {items}. {_cap(p)} gives away {c} {items} and puts "
        f"the rest equally into {k} bags. How many {items} are in each bag?"
    )
    return (
        prompt,
        [f"{n} has {e1} {items}.", f"After giving some away {p} has {e2} {items}.", f"Each bag has {e3} {items}."],
        f,
    )


def _t_ages(rng):
    (n, _, _), (n2, _, _), (n3, _, _) = _who(rng, 3)
    a, b = rng.randint(2, 20), rng.randint(1, 15)
    e1, d = _eq(a, "+", b)
    e2, e = _eq(d, "*", 2)
    prompt = f"{n} is {a} years old. {n2} is {b} years older than {n}. {n3} is twice as old as {n2}. How old is {n3}?"
    return prompt, [f"{n2} is {e1} years old.", f"{n3} is {e2} years old."], e


def _t_trips(rng):
    ((n, p, pos),) = _who(rng)
    items = rng.choice(ITEMS)
    a, b, c = rng.randint(2, 9), rng.randint(2, 6), rng.randint(1, 20)
    e1, d = _eq(a, "*", b)
    e2, e = _eq(d, "-", c)
    if e < 0:
        c = rng.randint(1, d)
        e2, e = _eq(d, "-", c)
    prompt = (
        f"{n} carries {a} {items} on each trip and makes {b} trips. Then {p} drops {c} {items}. "
        f"How many {items} does {n} have left?"
    )
    return prompt, [f"{n} carries {e1} {items}.", f"{_cap(p)} has {e2} {items} left."], e


TEMPLATES: tuple[Callable, ...] = (
    _t_half,
    _t_packs,
    _t_give_buy,
    _t_share,
    _t_boxes,
    _t_wage,
    _t_pages,
    _t_change,
    _t_bags,
    _t_ages,
    _t_trips,
)


def format_solution(steps: list[str], answer: int) -> str:
    return "\n".join([*steps, f"Answer: {answer}"])


def generate(rng: random.Random) -> WordProblem:
    """A random word problem (deterministic for a seeded ``rng``)."""
    prompt, steps, answer = rng.choice(TEMPLATES)(rng)
    return WordProblem(prompt, format_solution(steps, answer), answer)


def problems(rng: random.Random, held_out: bool) -> Iterator[WordProblem]:
    """Endless stream from the train (or held-out) side of the fixed 1-in-10 split."""
    while True:
        p = generate(rng)
        if is_held_out(p.prompt) == held_out:
            yield p


def parse_answer(text: str) -> int | None:
    """The integer after the last ``Answer:`` (None if there is none)."""
    i = text.rfind("Answer:")
    if i < 0:
        return None
    rest = text[i + len("Answer:") :].lstrip(" \t")
    j = 1 if rest[:1] == "-" else 0
    k = j
    while k < len(rest) and rest[k].isascii() and rest[k].isdigit():
        k += 1
    return int(rest[:k]) if j < k <= j + 18 else None  # no answer here has more than 18 digits


def grade(text: str, answer: int) -> bool:
    return parse_answer(text) == answer


# --- mistakes a small model makes: candidates for the target's refinement training -----------

_OPS = "+-*/"


def _parse_eq(line: str) -> tuple[int, int, int, int, str, int] | None:
    """Locate ``a op b = c`` in a line: (start, end, a, b, op, c) via plain string ops."""
    toks = line.split(" ")
    for i in range(len(toks) - 4):
        a, op, b, eq, c = toks[i : i + 5]
        c = c.rstrip(".")
        if (
            op in _OPS
            and len(op) == 1
            and eq == "="
            and a.lstrip("-").isdigit()
            and b.lstrip("-").isdigit()
            and c.lstrip("-").isdigit()
        ):
            return i, i + 5, int(a), int(b), op, int(c)
    return None


def _apply(a: int, op: str, b: int) -> int:
    return _eq(a, op, b)[1]


def corrupt(solution: str, rng: random.Random) -> str:
    """A plausible wrong solution: a step off by a little (propagated), a wrong operation,
    a right chain with a wrong ``Answer:`` line, or a truncated one."""
    lines = solution.split("\n")
    body, last = lines[:-1], lines[-1]
    kind = rng.choice(("off", "off", "op", "answer", "truncate"))
    if kind == "truncate":
        cut = rng.randint(max(1, len(solution) // 4), max(2, len(solution) - len(last) - 1))
        return solution[:cut].rstrip()
    try:
        ans = int(last.split(":", 1)[1])
    except (IndexError, ValueError):
        ans = 0
    if kind == "answer":
        return "\n".join([*body, f"Answer: {ans + rng.choice((-3, -2, -1, 1, 2, 3, 10))}"])
    parsed = [_parse_eq(x) for x in body]
    idx = [i for i, p in enumerate(parsed) if p is not None]
    if not idx:
        return "\n".join([*body, f"Answer: {ans + 1}"])
    k = rng.choice(idx)
    remap: dict[int, int] = {}
    out = []
    value = ans
    for i, (line, p) in enumerate(zip(body, parsed)):
        if p is None:
            out.append(line)
            continue
        s, e, a, b, op, c = p
        a, b = remap.get(a, a), remap.get(b, b)
        if i == k and kind == "op":
            op = rng.choice([o for o in _OPS if o != op and (o != "/" or (b and a % b == 0))] or ["+"])
        new = _apply(a, op, b)
        if i == k and kind == "off":
            new = c + rng.choice((-3, -2, -1, 1, 1, 2, 3, 10))
        if new != c:
            remap[c] = new
        toks = line.split(" ")
        dot = "." if toks[e - 1].endswith(".") else ""
        toks[s:e] = [str(a), op, str(b), "=", f"{new}{dot}"]
        out.append(" ".join(toks))
        value = new
    return "\n".join([*out, f"Answer: {value}"])
