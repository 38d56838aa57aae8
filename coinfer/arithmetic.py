"""The ``arithmetic`` rule: every ``a op b = c`` written in a solution is recomputed.

Worked solutions of word problems (GSM8K style) carry their arithmetic inline:
``In May she sold 48 / 2 = 24 clips.`` A small model's commonest mistake is a wrong result
there; this check catches it exactly, without knowing the problem. A chain of numbers and
operators (+ - * / and x as times between numbers) right before an ``=`` is evaluated with the
usual precedence and compared with the number after it.

Linear time: one left-to-right tokenisation with ``str`` scans, no regular expressions.
"""

from __future__ import annotations

from fractions import Fraction

from coinfer.text import normalize

_OPS = "+-*/"
_MAX_TERMS = 64  # a chain longer than this is not a worked step: skipped, never evaluated
_MAX_DIGITS = 30


def _tokens(text: str) -> tuple[list[str | Fraction], list[int], list[int]]:
    """Numbers (as Fractions), operators, '=' and a '|' for anything else (a chain breaker), and
    where each token starts and ends in ``text``."""
    out: list[str | Fraction] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isascii() and ch.isdigit():
            j = i
            while j < n and (
                text[j].isascii()
                and text[j].isdigit()
                or (
                    text[j] == ","
                    and text[j + 1 : j + 4].isdigit()
                    and len(text[j + 1 : j + 4]) == 3
                    and not text[j + 4 : j + 5].isdigit()
                )
            ):
                j += 4 if text[j] == "," else 1
            if text[j : j + 1] == "." and text[j + 1 : j + 2].isdigit():
                j += 1
                while j < n and text[j].isascii() and text[j].isdigit():
                    j += 1
            raw = text[i:j].replace(",", "")
            out.append(Fraction(raw) if len(raw) <= _MAX_DIGITS else "|")
            starts.append(i)
            ends.append(j)
            i = j
            continue
        if ch in _OPS or ch == "=":
            out.append(ch)
        elif ch == "x" and out and isinstance(out[-1], Fraction):
            out.append("*")  # "3 x 4 = 12"
        elif ch == "$" or ch == " " or ch == "\t":
            i += 1
            continue  # "$5 + $3" and spacing do not break a chain
        else:
            out.append("|")
        starts.append(i)
        ends.append(i + 1)
        i += 1
    return out, starts, ends


def _evaluate(chain: list[str | Fraction]) -> Fraction | None:
    """Evaluate number (op number)* with * and / before + and -; None on division by zero."""
    terms: list[Fraction] = []
    signs: list[int] = []
    cur = chain[0]
    assert isinstance(cur, Fraction)
    sign = 1
    for k in range(1, len(chain), 2):
        op, num = chain[k], chain[k + 1]
        assert isinstance(num, Fraction)
        if op == "*":
            cur *= num
        elif op == "/":
            if num == 0:
                return None
            cur /= num
        else:
            terms.append(cur)
            signs.append(sign)
            cur, sign = num, (1 if op == "+" else -1)
    terms.append(cur)
    signs.append(sign)
    return sum((s * t for s, t in zip(signs, terms)), Fraction(0))


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{float(v):g}"


def _chain_start(vals: list[str | Fraction], k: int) -> int | None:
    """Where the chain ``number (op number)*`` that ends right before token ``k`` (an ``=``) begins; None
    where none of at least one operation and at most ``_MAX_TERMS`` terms does."""
    j = k - 1
    if j < 0 or not isinstance(vals[j], Fraction):
        return None
    while j - 2 >= 0 and isinstance(vals[j - 1], str) and vals[j - 1] in _OPS and isinstance(vals[j - 2], Fraction):
        j -= 2
    return j if 3 <= k - j <= 2 * _MAX_TERMS else None


def _chain(vals: list[str | Fraction], j: int, k: int) -> list[str | Fraction]:
    """The chain ``vals[j:k]``, its first term negated after a leading minus sign (``-3 + 5 = 2``)."""
    chain = vals[j:k]
    if j - 1 >= 0 and vals[j - 1] == "-":
        chain = [-chain[0]] + chain[1:]  # type: ignore[operator]
    return chain


def _result(toks: list[str | Fraction], k: int) -> tuple[int, Fraction] | None:
    """The number written after the ``=`` at token ``k``: (its last token, its value); None: none."""
    after = toks[k + 1 : k + 3]
    if after and isinstance(after[0], Fraction):
        return k + 1, after[0]
    if len(after) == 2 and after[0] == "-" and isinstance(after[1], Fraction):
        return k + 2, -after[1]  # "0 - 2 = -2"
    return None


def _equations(text: str) -> list[tuple[str, Fraction, Fraction | None, int, int]]:
    """Every ``chain = number`` in ``text`` (normalised): written step, written result, true result,
    and where the written result starts and ends."""
    toks, starts, ends = _tokens(text)
    out = []
    for k, tok in enumerate(toks):
        if tok != "=" or (res := _result(toks, k)) is None or (j := _chain_start(toks, k)) is None:
            continue
        chain = _chain(toks, j, k)
        written = " ".join(_fmt(x) if isinstance(x, Fraction) else x for x in chain)
        out.append((written, res[1], _evaluate(chain), starts[k + 1], ends[res[0]]))
    return out


def equations(text: str) -> list[tuple[str, Fraction, Fraction | None]]:
    """Every ``chain = number`` in ``text``: (written step, written result, true result)."""
    return [e[:3] for e in _equations(normalize(text))]


def first_wrong_equation(text: str) -> str:
    """'' when every equation holds, else ``arithmetic_wrong: 48 / 2 = 25 (expected 24)``."""
    for written, result, true in equations(text):
        if true is None:
            return f"arithmetic_wrong: {written} divides by zero"
        if true != result:
            return f"arithmetic_wrong: {written} = {_fmt(result)} (expected {_fmt(true)})"
    return ""


def corrected_prefix(text: str) -> str | None:
    """The text up to its first wrong equation's result, with the true result written instead (what a
    calculator would have written there), and what the model wrote right after its value up to the end
    of the next word or punctuation (``_after_value``): the model chose the operation and its operands,
    only the computed value is replaced, and the model continues from there. None when every equation
    holds or the first wrong one divides by zero. The text is normalised first (``coinfer.text.normalize``;
    a model's plain-ASCII answer is unchanged by it)."""
    norm = normalize(text)
    for _, result, true, start, end in _equations(norm):
        if true is None:
            return None
        if true != result:
            # a value _fmt cannot write exactly (7 / 3) would be wrong again: not corrected
            return norm[:start] + _fmt(true) + _after_value(norm, end) if Fraction(_fmt(true)) == true else None
    return None


def _after_value(text: str, end: int) -> str:
    """What follows a corrected value at ``end`` in the model's text, kept so that the model does not go
    on writing digits after it: a value cut right after its digits is continued as a longer number by the
    model that wrote it wrong (a demo target wrote ``68 - 63 = 55`` six times over after each correction
    to ``= 5``). The spaces and the word after it (``5 pages``), else the one character (``5.``, ``5;``)."""
    j = end
    while j < len(text) and text[j] == " ":
        j += 1
    k = j
    while k < len(text) and text[k].isalpha():
        k += 1
    if k > j:
        return text[end:k]
    return text[end : j + 1] if j < len(text) and not text[j].isdigit() else ""


def repaired(text: str) -> str | None:
    """``text`` with every equation's result rewritten to its true value in place, and each wrong value
    carried to where the text uses it afterwards: a number written after an equation whose result was
    wrong, equal to that result as written, becomes its true value -- an operand of a later step (what
    the model computed with) or the answer it states (``Aisha reads 6 * 2 = 13 pages. 43 - 13 = 29 are
    left. Answer: 29`` -> ``... 6 * 2 = 12 pages. 43 - 12 = 31 are left. Answer: 31``). The operations and
    operands the model chose stay its own: what they compute is a calculator's, so a draft that chose
    the wrong operation is still wrong once repaired (the LLM verifier judges it). None where nothing
    changed, or where an equation divides by zero or its true value has no exact decimal (7 / 3). One
    pass over the text, linear in it; normalised first (``coinfer.text.normalize``)."""
    norm = normalize(text)
    toks, starts, ends = _tokens(norm)
    vals = list(toks)  # the tokens with the repairs made so far: what later chains compute with
    carried: dict[Fraction, Fraction] = {}  # a wrong result as written -> its true value
    edits: list[tuple[int, int, str]] = []
    results: set[int] = set()  # tokens that are a result: recomputed, never carried into
    for k, tok in enumerate(toks):
        if isinstance(tok, Fraction) and k not in results and tok in carried:
            vals[k] = carried[tok]
            edits.append((starts[k], ends[k], _fmt(carried[tok])))
        if tok != "=" or (res := _result(toks, k)) is None:
            continue
        r, written = res
        results.add(r)
        if (j := _chain_start(vals, k)) is None:
            continue
        true = _evaluate(_chain(vals, j, k))
        if true is None or Fraction(_fmt(true)) != true:
            return None  # division by zero, or a value a calculator cannot write exactly here
        if true != written:
            carried[written] = true
            edits.append((starts[k + 1], ends[r], _fmt(true)))
            if r == k + 1 and true >= 0:
                vals[r] = true  # "2 + 3 = 6 + 1 = 7": the next chain begins at this result
    if not edits:
        return None
    pieces, at = [], 0
    for a, b, new in edits:  # in text order, none overlapping: one pass
        pieces += [norm[at:a], new]
        at = b
    out = "".join(pieces) + norm[at:]
    return out if out != text else None
