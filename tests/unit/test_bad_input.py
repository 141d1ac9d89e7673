"""Bad input, rejected before anything expensive starts, with one line that says what to change:
GGUF files cut at every header boundary or carrying hostile counts and lengths (no large
allocation: checked with tracemalloc), invalid options of the server commands, malformed study
specs; and no shell string anywhere in the sources."""

from __future__ import annotations

import re
import struct
import tracemalloc
from pathlib import Path

import pytest

from xover.errors import GGUFError
from xover.gguf.inspect import parse_header, read_header

SRC = Path(__file__).resolve().parents[2] / "src" / "xover"
MAX_ALLOC = 4 << 20  # bytes: a hostile header must never make the reader allocate more than this


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    return write_model(PRESETS["tiny-moe"], tmp_path_factory.mktemp("bad") / "tiny.gguf", seed=0).path


def _rejected(data: bytes, needle: str) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as e:
            parse_header(data, "x.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("x.gguf: ") and needle in msg, msg
    assert peak < MAX_ALLOC, f"{peak} bytes allocated to reject {msg}"
    return msg


def _boundaries(data: bytes) -> list[int]:
    """Every offset where a header field of ``data`` starts (walking the real structure), plus one
    byte into each: cuts there leave a field whole-but-missing or half-read."""
    order = "<"
    pos = 8
    n_tensors, n_kv = struct.unpack_from(order + "QQ", data, pos)
    cuts = [0, 1, 3, 4, 7, 8, 16, 24]
    pos = 24

    def string(p: int) -> int:
        (n,) = struct.unpack_from(order + "Q", data, p)
        cuts.extend((p, p + 4, p + 8, p + 8 + n // 2))
        return p + 8 + n

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        pos = string(pos)
        (vtype,) = struct.unpack_from(order + "I", data, pos)
        cuts.append(pos)
        pos += 4
        if vtype == 8:
            pos = string(pos)
        elif vtype == 9:
            item, count = struct.unpack_from(order + "IQ", data, pos)
            cuts.extend((pos, pos + 4, pos + 12))
            pos += 12
            for i in range(count):
                if item == 8:
                    pos = (
                        string(pos)
                        if i < 3 or i == count - 1
                        else pos + 8 + struct.unpack_from(order + "Q", data, pos)[0]
                    )
                else:
                    pos += scalar[item]
            cuts.append(pos - 1)
        else:
            cuts.append(pos)
            pos += scalar[vtype]
    for _ in range(n_tensors):
        pos = string(pos)
        (n_dims,) = struct.unpack_from(order + "I", data, pos)
        cuts.extend((pos, pos + 4))
        pos += 4 + 8 * n_dims
        cuts.extend((pos - 8, pos, pos + 4))
        pos += 4 + 8
    cuts.append(pos - 1)
    return sorted({c for c in cuts if 0 <= c < pos})


def test_truncated_at_every_header_boundary(model: Path) -> None:
    data = model.read_bytes()
    header_end = read_header(model).data_offset
    cuts = _boundaries(data[:header_end] + b"\0" * 64)
    assert len(cuts) > 100
    for cut in cuts:
        msg = _rejected(data[:cut], "GGUF")
        assert "truncated" in msg or "not a GGUF" in msg or "corrupt" in msg, (cut, msg)


def _kv_file(key: bytes, vtype: int, payload: bytes, n_tensors: int = 0, n_kv: int = 1) -> bytes:
    return (
        b"GGUF"
        + struct.pack("<IQQ", 3, n_tensors, n_kv)
        + struct.pack("<Q", len(key))
        + key
        + struct.pack("<I", vtype)
        + payload
    )


@pytest.mark.parametrize(
    "data, needle",
    [
        (b"GGML" + b"\0" * 60, "not a GGUF file"),
        (b"\x7fELF" + b"\0" * 60, "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 99) + b"\0" * 56, "version"),
        (b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0), "claims 9223372036854775808 tensors"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**64 - 1), "metadata keys"),
        # a key whose length is beyond the file, and one far beyond any honest string
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1000) + b"abc" + b"\0" * 16, "needs 1000 bytes"),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"\0" * 16,
            "claims 4611686018427387904 bytes",
        ),
        # a string value whose length is beyond the file
        (_kv_file(b"general.name", 8, struct.pack("<Q", 2**40) + b"tiny"), "claims 1099511627776 bytes"),
        # arrays claiming absurd lengths of numbers and of strings
        (
            _kv_file(b"tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2**61) + b"\0" * 32),
            "claims 2305843009213693952 items",
        ),
        (_kv_file(b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**60) + b"\0" * 32), "more than the file holds"),
        (
            _kv_file(b"x", 9, struct.pack("<IQ", 8, 3) + struct.pack("<Q", 2**50) + b"\0" * 32),
            "claims 1125899906842624 bytes",
        ),
        (_kv_file(b"x", 9, struct.pack("<IQ", 9, 2) + b"\0" * 64), "nests arrays"),
        (_kv_file(b"x", 77, b"\0" * 16), "unknown value type 77"),
        (_kv_file(b"x", 9, struct.pack("<IQ", 1234, 1) + b"\0" * 16), "unknown item type 1234"),
    ],
)
def test_hostile_header(data: bytes, needle: str) -> None:
    _rejected(data, needle)


def _tensor_file(n_dims: int, dims: list[int], ggml_type: int = 0) -> bytes:
    name = b"blk.0.attn_q.weight"
    info = (
        struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims)
    )
    return b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info + struct.pack("<IQ", ggml_type, 0) + b"\0" * 64


@pytest.mark.parametrize(
    "data, needle",
    [
        (_tensor_file(99, [1] * 4), "has 99 dimensions"),
        (_tensor_file(0, []), "has 0 dimensions"),
        (_tensor_file(4, [2**40] * 4), "blk.0.attn_q.weight"),
        (_tensor_file(2, [4096, 4096], ggml_type=999), "blk.0.attn_q.weight"),
    ],
)
def test_hostile_tensor_table(data: bytes, needle: str) -> None:
    _rejected(data, needle)


# ---- options of the commands that start servers ----------------------------------------------------


# ---- no shell strings ---------------------------------------------------------------------------------

_SHELL = re.compile(
    r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(|subprocess\.(getoutput|getstatusoutput)\s*\("
    r"|create_subprocess_shell|os\.exec\w*p?e?\s*\(\s*['\"]/bin/sh"
)


def test_no_shell_strings_in_the_sources() -> None:
    """Every child process is started from an argument list: nothing in src/ goes through a shell."""
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 30
    hits = [
        f"{f.relative_to(SRC)}:{i}: {line.strip()}"
        for f in files
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if _SHELL.search(line)
    ]
    assert hits == []
    spawners = [f.relative_to(SRC).as_posix() for f in files if re.search(r"subprocess\.(Popen|run)\(", f.read_text())]
    for name in spawners:  # and each call passes a list
        for m in re.finditer(r"subprocess\.(Popen|run)\(\s*([^,)]+)", (SRC / name).read_text()):
            assert not m.group(2).lstrip().startswith(('f"', '"', "'", "f'")), f"{name}: {m.group(0)}"
