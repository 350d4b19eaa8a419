"""Worker message encoding against the shared vectors (docs/protocol.md §1)."""
import json
import struct

import pytest

from conftest import REPO
from staccato import wire
from staccato.wire import Message, WireError, decode, encode

VECTORS = json.loads((REPO / "testvectors" / "message_v1.json").read_text())
VALID = [t for t in VECTORS["tests"] if t["result"] == "valid"]
INVALID = [t for t in VECTORS["tests"] if t["result"] == "invalid"]
U64_FIELDS = ("call_id", "parent_call_id", "deadline_us", "send_ts_ns")


def test_vector_file_is_complete():
    assert VECTORS["schema"] == "staccato_message_v1"
    assert len(VECTORS["tests"]) == VECTORS["numberOfTests"]
    assert VALID and INVALID


def expected_fields(fields):
    """Vector fields as Message attributes (u64s are decimal strings)."""
    out = dict(fields)
    out["kind"] = wire.KINDS[fields["kind"]]
    for name in U64_FIELDS:
        out[name] = int(fields[name])
    out["inline"] = bytes.fromhex(fields["inline"])
    return out


def ids(t):
    return f"{t['tcId']}-{t['comment']}"


@pytest.mark.parametrize("case", VALID, ids=ids)
def test_valid_vector_decodes(case):
    msg = decode(bytes.fromhex(case["msg"]))
    for name, value in expected_fields(case["fields"]).items():
        assert getattr(msg, name) == value, name


@pytest.mark.parametrize("case", VALID, ids=ids)
def test_valid_vector_encodes_byte_for_byte(case):
    raw = bytes.fromhex(case["msg"])
    assert encode(Message(**expected_fields(case["fields"]))) == raw
    assert encode(decode(raw)) == raw


@pytest.mark.parametrize("case", INVALID, ids=ids)
def test_invalid_vector_is_rejected(case):
    with pytest.raises(WireError):
        decode(bytes.fromhex(case["msg"]))


def test_sizes():
    assert wire.HEADER.size == wire.HEADER_LEN == 64
    assert wire.MESSAGE_LEN == 1024 and wire.INLINE_MAX == 960


def test_roundtrip_all_fields():
    msg = Message(wire.INVOKE, 0, 7, (3 << 32) | 9, (1 << 63) | 5, 3, 3, 0,
                  1_790_000_000_000_000, 99, 0, b"fooabcd")
    raw = encode(msg)
    assert len(raw) == 1024
    assert decode(raw) == msg
    assert raw[64:71] == b"fooabcd" and raw[71:] == bytes(1024 - 71)


def test_decode_accepts_bytearray_and_memoryview_slices():
    raw = encode(Message(wire.COMPLETION, payload_len=2, call_id=5, worker_id=1, inline=b"ok"))
    big = bytearray(3 * 1024)
    big[1024:2048] = raw
    view = memoryview(big)[1024:2048]
    for buf in (bytearray(raw), view):
        msg = decode(buf)
        assert type(msg.inline) is bytes and msg.inline == b"ok"


def test_decoder_ignores_bytes_past_the_payload():
    raw = bytearray(encode(Message(wire.DISPATCH, payload_len=3, call_id=1, worker_id=1, inline=b"abc")))
    raw[500] = 0xFF
    assert decode(raw).inline == b"abc"


def test_invoke_in_shm_keeps_name_inline():
    msg = Message(wire.INVOKE, wire.PAYLOAD_IN_SHM, 1 << 20, 1, 2, 1, 4, 0, 0, 0, 0, b"echo")
    raw = encode(msg)
    assert decode(raw).inline == b"echo"
    # In shm, name_len is not bounded by payload_len (input only) ...
    assert decode(encode(Message(wire.INVOKE, wire.PAYLOAD_IN_SHM, 0, 1, 2, 1, 4,
                                 inline=b"echo"))).payload_len == 0
    # ... but still by the 64-byte name limit.
    bad = bytearray(raw)
    struct.pack_into("<H", bad, 28, 65)
    with pytest.raises(WireError):
        decode(bad)


def test_non_failure_messages_have_no_error_kind_but_all_codes_valid_on_failure():
    for code in range(1, 10):
        raw = encode(Message(wire.FAILURE, error_kind=code, call_id=1))
        assert decode(raw).error_kind == code


def test_encode_refuses_oversized_inline():
    with pytest.raises(WireError):
        encode(Message(wire.COMPLETION, payload_len=961, inline=bytes(961)))


def test_wire_error_is_a_value_error():
    assert issubclass(WireError, ValueError)
    with pytest.raises(ValueError):
        decode(b"")


# ---- the rest of the cross-language contract (testvectors/contract_v1.json)

CONTRACT = json.loads((REPO / "testvectors" / "contract_v1.json").read_text())


def test_error_kinds_are_the_contracts():
    from staccato.errors import ERROR_NAMES
    want = {k["code"]: k["name"] for k in CONTRACT["error_kinds"]}
    assert ERROR_NAMES == want
    assert wire.ERROR_KIND_MAX == max(want)


@pytest.mark.parametrize("case", CONTRACT["payload_files"], ids=lambda c: c["path"])
def test_payload_file_names_are_the_contracts(case):
    name = wire.shm_file_name(int(case["call_id"]), wire.KINDS[case["kind"]])
    assert "shm/" + name == case["path"]


@pytest.mark.parametrize("case", CONTRACT["channel_files"], ids=lambda c: str(c["id"]))
def test_channel_file_names_are_the_contracts(case):
    assert wire.channel_file_names(case["id"]) == (case["e2w"], case["w2e"])


def test_only_the_contracts_environment_variables_are_read():
    import re
    src = REPO / "runtimes" / "python" / "staccato"
    used = set()
    for f in src.rglob("*.py"):
        used |= set(re.findall(r"""["'](STACCATO_[A-Z0-9_]+)["']""", f.read_text()))
    allowed = set(CONTRACT["env"]["launcher"]) | set(CONTRACT["env"]["runtime"]["python"])
    assert used, "the scan found nothing: it is broken"
    assert used <= allowed, f"not in testvectors/contract_v1.json: {sorted(used - allowed)}"
