"""Fuzz the GGUF header reader: any byte string is either parsed or rejected with GGUFError, fast,
without large allocations. The number of cases is bounded for CI; XOVER_FUZZ_EXAMPLES raises it."""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xover.errors import GGUFError
from xover.gguf.inspect import parse_header

EXAMPLES = int(os.environ.get("XOVER_FUZZ_EXAMPLES", "300"))
_settings = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _header(n_tensors: int, n_kv: int, tail: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + tail


@_settings
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    try:
        parse_header(data, "fuzz")
    except GGUFError as e:
        assert "\n" not in str(e)


@_settings
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=256))
def test_hostile_counts(n_tensors: int, n_kv: int, tail: bytes) -> None:
    try:
        parse_header(_header(n_tensors, n_kv, tail), "fuzz")
    except GGUFError as e:
        assert "\n" not in str(e)


@_settings
@given(st.integers(0, 2**64 - 1), st.integers(0, 12), st.binary(max_size=64))
def test_hostile_string_and_array_lengths(length: int, vtype: int, tail: bytes) -> None:
    # one KV whose key length / value claims `length` bytes or items
    kv = struct.pack("<Q", 4) + b"key." + struct.pack("<I", vtype) + struct.pack("<Q", length) + tail
    try:
        parse_header(_header(0, 1, kv), "fuzz")
    except GGUFError as e:
        assert "\n" not in str(e)
