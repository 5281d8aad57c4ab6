"""HTTP Range header parsing (RFC 9110 §14.1.2), a pure function with its own tests."""

from __future__ import annotations

import re

_SPEC = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")


class RangeError(ValueError):
    """The Range header cannot be satisfied for this file (answered with 416)."""


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """`bytes=a-b` / `bytes=a-` / `bytes=-n` -> half-open (start, end) within `size`.

    Returns None when the header should be ignored (another unit, several ranges: the whole file is
    sent, as RFC 9110 allows). Raises RangeError when the range lies outside the file or is malformed.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    m = _SPEC.match(spec)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        raise RangeError(f"malformed Range header {header!r}: use bytes=START-END, bytes=START- or bytes=-N")
    first, last = m.group(1), m.group(2)
    if first == "":  # suffix: the last N bytes
        n = int(last)
        if n == 0:
            raise RangeError(f"Range {header!r} asks for no bytes")
        return max(0, size - n), size
    start = int(first)
    end = size if last == "" else min(int(last) + 1, size)
    if start >= size or (last != "" and int(last) < start):
        raise RangeError(f"Range {header!r} is outside the file of {size} bytes")
    return start, end
