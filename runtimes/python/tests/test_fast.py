"""staccato._fast, the hot path in C, against the Python reference.

The module is optional (scripts/setup.sh builds it); where it was built it
must be the one in use, accept exactly the messages wire.decode accepts and
pack the same bytes as the Python pack. The channel and launcher tests run
the rest through both (`make test` runs this directory twice, once
with STACCATO_PY_PURE=1)."""
import json
import os
import random
import struct
import sysconfig

import pytest

from conftest import PYTHON_RUNTIME, REPO
from staccato import wire
from staccato.wire import WireError, decode

BUILT = (PYTHON_RUNTIME / "staccato" / ("_fast" + sysconfig.get_config_var("EXT_SUFFIX"))).exists()
PURE = bool(os.environ.get("STACCATO_PY_PURE"))
VECTORS = json.loads((REPO / "testvectors" / "message_v1.json").read_text())["tests"]

if not BUILT and os.environ.get("STACCATO_REQUIRE_FAST"):
    raise RuntimeError("STACCATO_REQUIRE_FAST is set (make test) but staccato._fast was not built: "
                       "run scripts/setup.sh and read its warning")
pytestmark = pytest.mark.skipif(not BUILT, reason="staccato._fast was not built (scripts/setup.sh)")


def test_the_built_module_is_the_one_in_use_unless_pure_is_asked_for():
    if PURE:
        assert wire.FAST is None
    else:
        assert wire.FAST is not None, "built but not imported"
        assert wire.pack is wire.FAST.pack


@pytest.fixture(scope="module")
def fast():
    from staccato import _fast
    _fast.init(WireError)
    return _fast


def python_pack(*fields):
    *header, inline = fields
    return wire.HEADER.pack(*header, bytes(12)) + inline + bytes(wire.INLINE_MAX - len(inline))


def accepts(raw):
    try:
        decode(raw)
    except WireError:
        return False
    return True


def test_the_constants_are_the_wires(fast):
    assert (fast.MESSAGE_LEN, fast.INLINE_MAX, fast.ERROR_KIND_MAX) == (
        wire.MESSAGE_LEN, wire.INLINE_MAX, wire.ERROR_KIND_MAX)


@pytest.mark.parametrize("case", VECTORS, ids=lambda t: f"{t['tcId']}-{t['comment']}")
def test_every_vector_is_judged_as_decode_judges_it(fast, case):
    raw = bytes.fromhex(case["msg"])
    assert (fast.check_message(raw) is None) == (case["result"] == "valid") == accepts(raw)


def test_random_headers_are_judged_as_decode_judges_them(fast):
    # Fields drawn around every boundary decode checks, so both verdicts
    # come up often; the seed keeps a failure reproducible.
    rng = random.Random(1234)
    seen = {True: 0, False: 0}
    for _ in range(30000):
        kind = rng.choice((rng.randrange(0, 10), 5, 6, 7, 8))
        flags = rng.choice((0, 0, 1, 2, 3, 4, rng.randrange(0, 1 << 16)))
        name_len = rng.choice((0, 1, 24, 25, 64, 65, 537, 538, rng.randrange(0, 1 << 16)))
        payload_len = rng.choice((0, name_len, name_len + 1, 959, 960, 961, rng.randrange(0, 1 << 32)))
        error_kind = rng.choice((0, 0, 0, 1, 14, 15, rng.randrange(0, 1 << 16)))
        reserved = bytes(12) if rng.random() < 0.9 else bytes([0] * 11 + [rng.randrange(1, 256)])
        raw = struct.pack("<HHIQQIHHQQI12s", kind, flags, payload_len, rng.getrandbits(64), 0, 1,
                          name_len, error_kind, 0, 0, 0, reserved) + bytes(960)
        ok = accepts(raw)
        assert (fast.check_message(raw) is None) == ok, (kind, flags, payload_len, name_len, error_kind, reserved)
        seen[ok] += 1
    assert min(seen.values()) > 1000, seen


def test_a_message_of_another_size_is_refused(fast):
    assert fast.check_message(bytes(1023)) is not None
    assert fast.check_message(bytes(1025)) is not None


@pytest.mark.parametrize("inline", [b"", b"x", b"y" * 960])
def test_pack_makes_the_python_packs_bytes(fast, inline):
    fields = (wire.COMPLETION, wire.CPU_TIME, len(inline), 2**64 - 1, 7, 2**32 - 1, 0, 0,
              123456789, 2**63 + 5, 2**32 - 1, inline)
    assert fast.pack(*fields) == python_pack(*fields)


def test_pack_refuses_what_the_python_pack_refuses(fast):
    with pytest.raises(WireError):
        fast.pack(wire.COMPLETION, 0, 961, 1, 0, 1, 0, 0, 0, 0, 0, b"z" * 961)
    with pytest.raises(OverflowError):
        fast.pack(1 << 16, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, b"")
    with pytest.raises(OverflowError):
        fast.pack(wire.COMPLETION, 0, 0, -1, 0, 1, 0, 0, 0, 0, 0, b"")
    with pytest.raises(TypeError):
        fast.pack(wire.COMPLETION, 0, 0, 1)
