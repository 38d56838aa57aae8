"""The ``arithmetic`` rule: every ``a op b = c`` written in a solution is recomputed.

Worked solutions of word problems (GSM8K style) carry their arithmetic inline:
``In May she sold 48 / 2 = 24 clips.`` A small model's commonest mistake is a wrong result
there; this check catches it exactly, without knowing the problem. A chain of numbers and
operators (+ - * / and x as times between numbers) right before an ``=`` is evaluated with the
usual precedence and compared with the number after it.

Linear time: one left-to-right tokenisation with ``str`` scans, no regular expressions.
"""

from __future__ import annotations

import enum
from fractions import Fraction

from coinfer.extract import DEFAULT_MARKER
from coinfer.text import normalize

_OPS = "+-*/"
_MAX_TERMS = 64  # a chain longer than this is not a worked step: skipped, never evaluated
_MAX_DIGITS = 30  # a number of more characters (point included) is no number to the check
_SHOWN_DIGITS = 12  # significant digits of a value a message cannot show exactly (7 / 3)


def _group_at(text: str, j: int) -> bool:
    """A thousands group goes on at ``j`` in a number's whole part (``1,000``: ``,000``)."""
    return (
        text[j : j + 1] == ","
        and len(text[j + 1 : j + 4]) == 3
        and text[j + 1 : j + 4].isdigit()
        and not text[j + 4 : j + 5].isdigit()
    )


def _decimals_at(text: str, j: int) -> bool:
    """A number's decimals begin at ``j`` (``3.5``: ``.5``)."""
    return text[j : j + 1] == "." and text[j + 1 : j + 2].isdigit()


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
            while j < n and (text[j].isascii() and text[j].isdigit() or _group_at(text, j)):
                j += 4 if text[j] == "," else 1
            if _decimals_at(text, j):
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


def _plain(v: Fraction) -> str | None:
    """``v`` written exactly in plain decimal notation, as a calculator writes it and ``_tokens`` reads it
    back: never an exponent (``1e-05`` is no number here), never float noise (0.1 + 0.2 is 0.3), an
    integer without a point; None where that takes over ``_MAX_DIGITS`` characters (what the check reads
    as a number) or no finite decimal is ``v`` (7 / 3). Bounded work whatever ``v``: the digit limit is
    checked before any string of digits is made (``str`` of a huge int is quadratic and refused past
    4,300 digits)."""
    den = v.denominator
    twos = (den & -den).bit_length() - 1  # den = 2^twos * 5^fives where v has a finite decimal
    den >>= twos
    fives = 0
    while den % 5 == 0 and fives <= _MAX_DIGITS:
        den //= 5
        fives += 1
    places = max(twos, fives)
    if den != 1 or places > _MAX_DIGITS or abs(v) >= 10**_MAX_DIGITS:
        return None
    digits = str(abs(v.numerator) * 10**places // v.denominator).rjust(places + 1, "0")
    body = f"{digits[:-places]}.{digits[-places:]}" if places else digits
    if len(body) > _MAX_DIGITS:
        return None
    return "-" + body if v < 0 else body


def _shown(v: Fraction) -> str:
    """``v`` for a message: exactly where ``_plain`` writes it, else rounded to ``_SHOWN_DIGITS``
    significant digits, in plain decimals too (``about 2.33333333333``)."""
    if (exact := _plain(v)) is not None:
        return exact
    size = abs(v)
    if size < Fraction(1, 10 ** (_MAX_DIGITS - 2)) or size >= 10**_MAX_DIGITS:
        return f"a number of over {_MAX_DIGITS} digits"
    if size >= 1:
        places = max(0, _SHOWN_DIGITS - len(str(size.numerator // size.denominator)))
    else:  # after the zeros that follow the point (0.00333...: 2 of them)
        places = min(_MAX_DIGITS - 2, _SHOWN_DIGITS + len(str(size.denominator // size.numerator)) - 1)
    rounded = _plain(Fraction(round(v * 10**places), 10**places))
    return f"about {rounded}" if rounded is not None else f"a number of over {_MAX_DIGITS} digits"


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
        written = " ".join(_shown(x) if isinstance(x, Fraction) else x for x in chain)
        out.append((written, res[1], _evaluate(chain), starts[k + 1], ends[res[0]]))
    return out


def equations(text: str) -> list[tuple[str, Fraction, Fraction | None]]:
    """Every ``chain = number`` in ``text``: (written step, written result, true result)."""
    return [e[:3] for e in _equations(normalize(text))]


def first_wrong_equation(text: str) -> str:
    """'' when every equation holds, else ``arithmetic_wrong: 48 / 2 = 25 (expected 24)``. A result holds
    when it is the true value exactly, which is what ``repaired`` and ``corrected_prefix`` write."""
    for written, result, true in equations(text):
        if true is None:
            return f"arithmetic_wrong: {written} divides by zero"
        if true != result:
            return f"arithmetic_wrong: {written} = {_shown(result)} (expected {_shown(true)})"
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
            # a value with no exact plain decimal (7 / 3) would be wrong again: not corrected
            return None if (value := _plain(true)) is None else norm[:start] + value + _after_value(norm, end)
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


class _Use(enum.Enum):
    """What a number is to ``repaired``, by where it stands; a number none of these is prose."""

    RESULT = "result"  # right after an '=': an equation's is recomputed; never carried into
    FIRST = "first"  # a later equation's first term: may be written with a sign (-3 + 5 = 2)
    MIDDLE = "middle"  # a term after an operator: no negative value can be written there (4 * -3)
    ANSWER = "answer"  # right after the answer marker (Answer: 29)


def _uses(norm: str, toks: list[str | Fraction], starts: list[int]) -> tuple[dict[int, int], dict[int, _Use]]:
    """Every equation (its '=' token -> its chain's first token) and what each number token is, by
    where it stands; a number token not among them is prose. Each chain is walked once: linear."""
    chains: dict[int, int] = {}
    uses: dict[int, _Use] = {}
    for k, tok in enumerate(toks):
        if tok != "=" or (res := _result(toks, k)) is None:
            continue
        uses[res[0]] = _Use.RESULT
        if (j := _chain_start(toks, k)) is not None:
            chains[k] = j
            for i in range(j, k, 2):  # a chain that begins at a result ("= 3 + 1 = 4") keeps it a result
                uses.setdefault(i, _Use.FIRST if i == j else _Use.MIDDLE)
    at, i = norm.find(DEFAULT_MARKER), 0
    while at >= 0:
        end = at + len(DEFAULT_MARKER)
        while i < len(toks) and starts[i] < end:
            i += 1
        k = i + 1 if toks[i : i + 1] == ["-"] else i  # "Answer: -2": its sign
        if k < len(toks) and isinstance(toks[k], Fraction):
            uses.setdefault(k, _Use.ANSWER)
        at = norm.find(DEFAULT_MARKER, end)
    return chains, uses


def _written(toks: list[str | Fraction], i: int) -> tuple[int, Fraction]:
    """Where number ``i`` as written begins -- at its sign (``-2``: a minus no number stands before) --
    and its value so."""
    num = toks[i]
    assert isinstance(num, Fraction)
    if i >= 1 and toks[i - 1] == "-" and not (i >= 2 and isinstance(toks[i - 2], Fraction)):
        return i - 1, -num
    return i, num


def _rewrite(
    norm: str, toks: list[str | Fraction], starts: list[int], ends: list[int], i: int, value: Fraction
) -> str | None:
    """What to write over number ``i`` (with its sign) in ``norm`` for the text to read ``value`` there and
    nothing else changed; None where nothing does: no exact plain decimal; a minus written after a
    number or after an operator that follows one (``5 -3`` is another chain, ``4 * -3`` no term); a sign
    dropped after an operator (``* -3`` -> ``* 3`` joins or changes a chain); digits run into the
    neighbours (``3.5.7`` -> ``2.7``, ``1,5`` -> ``1,500``)."""
    new = _plain(value)
    first = _written(toks, i)[0]
    begins, prev = starts[first], toks[first - 1] if first >= 1 else "|"
    if new is None or (begins >= 2 and norm[begins - 1] in ",." and norm[begins - 2].isdigit()):
        return None
    if "." not in new and (_decimals_at(norm, ends[i]) or _group_at(norm, ends[i])):
        return None
    if isinstance(prev, Fraction):
        after_number = True
    else:
        after_number = prev in _OPS and first >= 2 and isinstance(toks[first - 2], Fraction)
    if value < 0 and first == i and after_number:
        return None
    if value >= 0 and first < i and isinstance(prev, str) and prev in _OPS:
        return None
    return new


class _Repair:
    """``repaired``'s one pass over a text's tokens, left to right: each equation recomputed on the values
    the repaired text reads (``vals``), each use of a wrong result given its true value."""

    def __init__(self, norm: str) -> None:
        self.norm = norm
        self.toks, self.starts, self.ends = _tokens(norm)
        self.chains, self.uses = _uses(norm, self.toks, self.starts)
        self.vals = list(self.toks)  # the tokens as the repaired text reads: what later chains compute with
        self.carried: dict[Fraction, Fraction] = {}  # a value as written -> its true value, while uses refer to it
        self.edits: list[tuple[int, int, str]] = []  # (start, end, new text): in text order, none overlapping
        self.last: tuple[Fraction, Fraction] | None = None  # the latest result: (as written, true)

    def run(self) -> str | None:
        """The repaired text (the text itself where nothing changed); None where an equation cannot be
        repaired."""
        for i, tok in enumerate(self.toks):
            if tok == "=" and (res := _result(self.toks, i)) is not None:
                if not self._result(i, res[0]):
                    return None
            elif isinstance(tok, Fraction) and self.uses.get(i) is not _Use.RESULT:
                self._use(i)
        pieces, at = [], 0
        for a, b, new in self.edits:  # one pass
            pieces += [self.norm[at:a], new]
            at = b
        return "".join(pieces) + self.norm[at:]

    def _result(self, k: int, r: int) -> bool:
        """The result ``r`` of the '=' at token ``k``, recomputed where ``k`` ends an equation; False where it
        cannot be written (a division by zero, no exact plain decimal)."""
        written = _written(self.toks, r)[1]
        true = _evaluate(_chain(self.vals, self.chains[k], k)) if k in self.chains else written
        if true is None:
            return False
        self.last = (written, true)
        if true == written:
            self.carried.pop(written, None)  # right (or no equation's): a later use of the value refers here
            self._read(r, true)
            return True
        self.carried[written] = true
        return self._write(r, true)

    def _use(self, i: int) -> None:
        """Number ``i``, no result: prose ends the carry of its value (a later use refers to it); an operand
        or the answer takes the true value of the wrong result it repeats, where it can be written; the
        answer also where it repeats the latest result (``... = 5 days, in 5 days. Answer: 5``)."""
        written, use = _written(self.toks, i)[1], self.uses.get(i)
        if use is None:
            self.carried.pop(written, None)
        elif (true := self.carried.get(written)) is not None:
            self._write(i, true)  # where it cannot be, the operand stays as written, and is so computed
        elif use is _Use.ANSWER and self.last is not None and self.last[0] == written != self.last[1]:
            self._write(i, self.last[1])  # the answer states the value last computed, even once prose did

    def _write(self, i: int, value: Fraction) -> bool:
        new = _rewrite(self.norm, self.toks, self.starts, self.ends, i, value)
        if new is None:
            return False
        self.edits.append((self.starts[_written(self.toks, i)[0]], self.ends[i], new))
        self._read(i, value)
        return True

    def _read(self, i: int, value: Fraction) -> None:
        """Number ``i`` with its sign reads ``value`` from here on: one signed number, '|' where its sign was
        (nothing to negate it again: ``_chain``)."""
        self.vals[_written(self.toks, i)[0]] = "|"
        self.vals[i] = value


def repaired(text: str) -> str | None:
    """``text`` with every equation's result rewritten to its true value in place, and each wrong value
    carried to where the text uses it afterwards, as far as the text shows a use: an operand of a later
    step, the chain that begins at the result (``2 - 5 = 3 + 1 = 4`` -> ``2 - 5 = -3 + 1 = -2``), the
    number after the answer marker (``Aisha reads 6 * 2 = 13 pages. 43 - 13 = 29 are left. Answer: 29``
    -> ``... 6 * 2 = 12 pages. 43 - 12 = 31 are left. Answer: 31``). Prose is never rewritten, and a use
    refers to the latest place that wrote its value: a number in prose or a right result of the same
    value ends the carry (``2 + 2 = 5 days. The 5 boxes cost 5 * 3 = 15``: only ``= 4``), except to an
    answer that states the latest result (``= 5 days, in 5 days. Answer: 5``). The operations
    and operands the model chose stay its own: what they compute is a calculator's, so a draft that
    chose the wrong operation is still wrong once repaired (the LLM verifier judges it). Values are
    exact, in plain decimals (``_plain``), so a repaired text holds every equation. None where nothing
    changed, or where an equation divides by zero or its true value has no exact plain decimal (7 / 3,
    over 30 digits). Linear: two passes over the tokens; normalised first (``coinfer.text.normalize``)."""
    out = _Repair(normalize(text)).run()
    return out if out is not None and out != text else None
