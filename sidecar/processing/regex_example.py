"""A few example strings a regex should match, to tell at start-up that a pattern can never match.

``example(pattern)`` builds candidates from the parsed pattern (the shortest repetition of each
part, each alternative of a branch, a printable character from each class) and returns the first
that the pattern really matches; ``False`` when every candidate fails although each construct
was understood (the pattern contradicts itself, e.g. ``a^b``); ``None`` when the pattern uses a
construct this does not model (lookarounds, backreferences, conditionals): then nothing is
claimed.
"""

from __future__ import annotations

import itertools
import re
import string
from typing import Any

try:  # Python 3.11+
    import re._constants as sre_c  # type: ignore[import-not-found]
    import re._parser as sre_p  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse as sre_p  # type: ignore[no-redef]

MAX_CANDIDATES = 32
_PRINTABLE = string.ascii_letters + string.digits + "_./-:"


class _Unsupported(Exception):
    pass


def example(pattern: re.Pattern[str]) -> str | bool | None:
    try:
        parsed = sre_p.parse(pattern.pattern, pattern.flags)
        candidates = _seq(list(parsed))
    except (_Unsupported, RecursionError, re.error):
        return None
    for c in candidates:
        if pattern.fullmatch(c):
            return c
    return False


def _seq(items: list[Any]) -> list[str]:
    out = [""]
    for op, av in items:
        options = _one(op, av)
        out = [a + b for a, b in itertools.islice(itertools.product(out, options), MAX_CANDIDATES)]
    return out


def _one(op: Any, av: Any) -> list[str]:
    if op is sre_c.LITERAL:
        return [chr(av)]
    if op is sre_c.NOT_LITERAL:
        return [next(c for c in _PRINTABLE if ord(c) != av)]
    if op is sre_c.ANY:
        return ["a"]
    if op is sre_c.IN:
        return _in(av)
    if op is sre_c.AT:
        return [""]
    if op is sre_c.SUBPATTERN:
        return _seq(list(av[-1]))
    if op is sre_c.BRANCH:
        return [c for alt in av[1] for c in _seq(list(alt))][:MAX_CANDIDATES]
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
        low, _high, body = av
        inner = _seq(list(body))
        if low == 0:
            return [""] + [c for c in inner[:4]]
        return [c * low for c in inner[:4]]
    if op is getattr(sre_c, "ATOMIC_GROUP", None):
        return _seq(list(av))
    raise _Unsupported(op)


def _in(items: list[Any]) -> list[str]:
    negate = any(op is sre_c.NEGATE for op, _ in items)
    members = [x for x in items if x[0] is not sre_c.NEGATE]

    def inside(ch: str) -> bool:
        for op, av in members:
            if op is sre_c.LITERAL and ord(ch) == av:
                return True
            if op is sre_c.RANGE and av[0] <= ord(ch) <= av[1]:
                return True
            if op is sre_c.CATEGORY and re.fullmatch(_CATEGORY.get(av, "(?!)"), ch):
                return True
        return False

    pool = _PRINTABLE
    if not negate:
        pool = "".join(chr(av) if op is sre_c.LITERAL else "" for op, av in members) + _PRINTABLE + "\n\t"
        for op, av in members:
            if op is sre_c.RANGE:
                pool += chr(av[0])
    picks = [c for c in dict.fromkeys(pool) if inside(c) != negate]
    printable = [c for c in picks if c.isprintable()]
    return (printable or picks)[:2] or ["\x00"]


_CATEGORY = {
    sre_c.CATEGORY_DIGIT: r"\d", sre_c.CATEGORY_NOT_DIGIT: r"\D", sre_c.CATEGORY_SPACE: r"\s",
    sre_c.CATEGORY_NOT_SPACE: r"\S", sre_c.CATEGORY_WORD: r"\w", sre_c.CATEGORY_NOT_WORD: r"\W",
}
