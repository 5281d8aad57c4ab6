"""parse_range against values worked out by hand (RFC 9110 byte ranges, half-open results)."""

from __future__ import annotations

import pytest

from weight_store.ranges import RangeError, parse_range
from weight_store.storage import StoreError, check_file_name, check_version


@pytest.mark.parametrize(("header", "size", "want"), [
    ("bytes=0-99", 1000, (0, 100)),
    ("bytes=100-", 1000, (100, 1000)),
    ("bytes=-10", 1000, (990, 1000)),
    ("bytes=-5000", 1000, (0, 1000)),  # a suffix longer than the file is the whole file
    ("bytes=990-5000", 1000, (990, 1000)),  # the end is clipped to the file
    ("bytes=999-999", 1000, (999, 1000)),
    ("items=0-1", 1000, None),  # another unit: ignored, the whole file is sent
    ("bytes=0-1,5-6", 1000, None),  # several ranges: ignored too
])
def test_parse_range_gives_half_open_byte_spans(header, size, want):
    assert parse_range(header, size) == want


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5-4", "bytes=-0", "bytes=-", "bytes=a-b"])
def test_parse_range_refuses_unsatisfiable_or_malformed_ranges(header):
    with pytest.raises(RangeError):
        parse_range(header, 1000)


@pytest.mark.parametrize("name", ["config.json", "model-00001-of-00002.safetensors", "tokenizer/tokenizer.json"])
def test_plain_relative_file_names_are_accepted(name):
    assert check_file_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "a/../b", "/etc/passwd", "a//b", ".env", "a b", "x\x00", "manifest.json",
                                  "a\\b", "é.bin", "/".join(["d"] * 9)])
def test_names_that_could_escape_or_confuse_are_refused(name):
    with pytest.raises(StoreError) as exc:
        check_file_name(name)
    assert exc.value.status == 400


def test_versions_are_plain_non_negative_integers():
    assert check_version("12") == 12 and check_version(0) == 0
    for bad in ("-1", "1.5", "1e3", "", " 1", True):
        with pytest.raises(StoreError):
            check_version(bad)
