"""A GGUF's type read from its header alone: what gguf-py's full reader says, without parsing the
vocabulary and the tensor table (seconds on a large model, before advise's first line)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support.helpers import skip_unless_installed

pytestmark = skip_unless_installed("gguf")


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _header(*kvs: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def test_the_header_says_what_the_full_reader_says():
    gguf = pytest.importorskip("gguf")
    from specmac import assets
    from specmac.backends.gguf_files import file_type

    files = sorted(Path(assets.__file__).parent.glob("*.gguf"))
    assert files
    for f in files:
        field = gguf.GGUFReader(str(f)).get_field("general.file_type")
        assert file_type(f) == int(field.contents()), f.name


def test_the_type_is_found_past_arrays_and_junk_is_refused(tmp_path):
    from specmac.backends.gguf_files import file_type, gguf_type

    tokens = struct.pack("<IQ", 8, 3) + b"".join(_string(t) for t in (b"a", b"bc", b"def"))  # strings
    scores = struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0.1, 0.2, 0.3)  # array of float32
    f = tmp_path / "m.gguf"
    f.write_bytes(_header(_string(b"tokenizer.ggml.tokens") + struct.pack("<I", 9) + tokens,
                          _string(b"tokenizer.ggml.scores") + struct.pack("<I", 9) + scores,
                          _string(b"general.name") + struct.pack("<I", 8) + _string(b"x"),
                          _string(b"general.file_type") + struct.pack("<II", 4, 15)))
    assert file_type(f) == 15 and gguf_type(str(f)) == "Q4_K_M"
    none = tmp_path / "none.gguf"
    none.write_bytes(_header(_string(b"general.name") + struct.pack("<I", 8) + _string(b"x")))
    assert file_type(none) is None
    for name, data in (("cut-q8_0.gguf", f.read_bytes()[:60]), ("not-f16.gguf", b"GGML" + bytes(40))):
        bad = tmp_path / name
        bad.write_bytes(data)
        with pytest.raises(ValueError):
            file_type(bad)
        assert gguf_type(str(bad)) == name.split("-")[1].removesuffix(".gguf").upper()  # as its name says
