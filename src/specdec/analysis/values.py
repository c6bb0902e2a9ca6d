"""Values that may be missing (None) in a benchmark's results: their ratios, and how reports print them."""

from __future__ import annotations

from typing import Any

#: What a table shows where a value is missing.
MISSING = "–"
#: Milliseconds per second (tables print step times in ms).
MS_PER_S = 1e3
#: Percent per unit.
PERCENT = 100


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when a is missing or b is missing or zero."""
    return a / b if a is not None and b else None


def fmt(x: Any, spec: str) -> str:
    """``x`` formatted with ``spec``, or :data:`MISSING`."""
    return MISSING if x is None else format(x, spec)


def ms(seconds: float) -> str:
    """A step time in milliseconds to three significant figures or more (a CPU's 206 ms, a GPU's 2.43 ms)."""
    value = seconds * MS_PER_S
    return format(value, ".0f" if value >= 100 else ".1f" if value >= 10 else ".2f")


def short(x: float) -> str:
    """A number in its shortest form (``format(x, "g")``: 0, 0.5, 1): temperatures, lenience, keys."""
    return format(x, "g")
