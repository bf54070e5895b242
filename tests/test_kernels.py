"""Kernel tests: docs/format.md vectors for both implementations, and parity of the
Cython core (``rmqstore._core``) with the pure twin (``rmqstore._pure``).

The core is skipped when not built, unless RMQSTORE_REQUIRE_EXTENSION=1.
"""

import inspect
import mmap
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rmqstore
from conftest import scaled
from rmqstore import _pure
from rmqstore.format import layout as L

try:
    from rmqstore import _core
except ImportError as exc:  # not built
    _core, _CORE_ERROR = None, exc

REQUIRE_EXTENSION = os.environ.get("RMQSTORE_REQUIRE_EXTENSION", "").strip().lower() not in (
    "", "0", "false", "no")  # as rmqstore._kernels reads it
FAST = settings(max_examples=scaled(60), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=scaled(150))


def _need_core():
    if _core is None:
        if REQUIRE_EXTENSION:
            pytest.fail(f"rmqstore._core is required but not importable: {_CORE_ERROR}")
        pytest.skip(f"rmqstore._core not built: {_CORE_ERROR}")
    if rmqstore.IMPLEMENTATION != "cython":
        # a pure-Python run leaves the core alone (its Message and MessageExt
        # are the twin's): the run with the core compares the two
        pytest.skip("the pure-Python run (RMQSTORE_PURE_PYTHON=1) does not load the core")
    return _core


@pytest.fixture(params=["pure", "core"])
def k(request):
    """Each implementation in turn."""
    return _pure if request.param == "pure" else _need_core()


@pytest.fixture
def core():
    return _need_core()


def outcome(fn, *args):
    """Result or exception type of fn(*args), for parity comparisons."""
    try:
        return "ok", fn(*args)
    except Exception as e:  # noqa: BLE001 - the type is the point
        return "raised", type(e)


# --- docs/format.md vectors -------------------------------------------------

BORN = bytes.fromhex("c0a8010a0000d431")  # 192.168.1.10:54321
STORE = bytes.fromhex("0a00000100002a9f")  # 10.0.0.1:10911
BORN_TS, STORE_TS = 1700000000000, 1700000000123
PROPS1 = (b"KEYS\x01key1 key2\x02TAGS\x01TagA\x02UNIQ_KEY\x01C0A8010A10921B6D358605265C000001"
          b"\x02CLUSTER\x01DefaultCluster\x02")
R1 = bytes.fromhex(
    "000000ccdaa320a769c865ed0000000300000000000000000000002a0000000040000000000000000000018bcfe5"
    "6800c0a8010a0000d4310000018bcfe5687b0a00000100002a9f0000000000000000000000000000000e48656c6c"
    "6f20526f636b65744d5109546f70696354657374005a4b455953016b657931206b6579320254414753015461674102"
    "554e49515f4b455901433041383031304131303932314236443335383630353236354330303030303102434c555354"
    "45520144656661756c74436c757374657202")
R1_ARGS = (3, 0, 42, 1073741824, 0, BORN_TS, BORN, STORE_TS, STORE, 0, 0, b"Hello RocketMQ",
           b"TopicTest", PROPS1, False)
R2 = bytes.fromhex(
    "00000076daa320a753d99e8b000000000000000000000000000000000000000000000000000000300000000000000001"
    "00000000000000000000000000000001" "00000001" "0000000000000002"
    "fe800000000000000000000000000001" "00002a9f" "00000000" "0000000000000000" "00000001" "41" "02"
    "5436" "0000")
R2_ARGS = (0, 0, 0, 0, 0x30, 1, bytes(15) + b"\x01" + b"\x00\x00\x00\x01", 2,
           bytes.fromhex("fe800000000000000000000000000001") + b"\x00\x00\x2a\x9f", 0, 0, b"A", b"T6",
           b"", False)
R3_TOPIC = b"%RETRY%" + b"G" * 130
R3_ARGS = (0, 0, 7, 2048, 0, BORN_TS, BORN, STORE_TS, STORE, 1, 0, b"retry-body", R3_TOPIC,
           b"TAGS\x01TagA\x02UNIQ_KEY\x01C0A8010A10921B6D358605265C000002\x02", False)
R4 = bytes.fromhex(
    "000000b4daa320a70d6cfbdc000000010000000000000000000000000000000000000000000000000000018bcfe5"
    "6800c0a8010a0000d4310000018bcfe5687b0a00000100002a9f000000000000000000000000000000086372632d"
    "626f647909546f70696354657374004854414753015461674102554e49515f4b455901433041383031304131303932"
    "3142364433353836303532363543303030303033025f5f435243333223013632393135323339393002")
R4_ARGS = (1, 0, 0, 0, 0, BORN_TS, BORN, STORE_TS, STORE, 0, 0, b"crc-body", b"TopicTest",
           b"TAGS\x01TagA\x02UNIQ_KEY\x01C0A8010A10921B6D358605265C000003", True)
MAX = 4 * 1024 * 1024 + L.RECORD_SIZE_SLACK


def test_core_exports_same_api(core):
    assert sorted(core.__all__) == sorted(_pure.__all__)
    def params(f):
        return [(p.name, p.default, p.kind) for p in inspect.signature(f).parameters.values()]

    for name in _pure.__all__:
        pf, cf = getattr(_pure, name), getattr(core, name)
        if isinstance(pf, type):  # a class: its constructor and public methods
            assert isinstance(cf, type), name  # (constructors: called by keyword in the parity tests)
            methods = sorted(m for m in vars(pf) if not m.startswith("_"))
            assert methods == sorted(m for m in vars(cf) if not m.startswith("_")), name
            for m in methods:
                if callable(vars(pf)[m]):  # (not the fields and properties)
                    assert params(getattr(pf, m)) == params(getattr(cf, m)), f"{name}.{m}"
        else:
            assert params(pf) == params(cf), name


def test_core_constants_match_layout(core):
    assert core._LAYOUT
    for name, value in core._LAYOUT.items():
        assert getattr(L, name) == value, name


@pytest.mark.parametrize("args, expected", [(R1_ARGS, R1), (R2_ARGS, R2), (R4_ARGS, R4)])
def test_encode_vectors(k, args, expected):
    assert k.encode_record(*args) == expected
    buf = bytearray(b"\xee" * (len(expected) + 10))
    assert k.write_record(buf, 7, *args) == len(expected)
    assert buf == b"\xee" * 7 + expected + b"\xee" * 3
    field = _pure._encoded_props_len(args[13], args[14])
    assert k.record_size(args[4], len(args[11]), len(args[12]), field, False) == len(expected)


def test_encode_v2_vector(k):
    r3 = k.encode_record(*R3_ARGS)
    assert len(r3) == 291
    assert r3[:12].hex() == "00000123daa320ab3bbfc442"
    body_end = 68 + 8 + 8 + 4 + len(b"retry-body")
    assert r3[body_end:body_end + 2].hex() == "0089"
    assert k.check_record(r3, 0, len(r3), True, False, MAX) == 291
    d = k.decode_record(r3, 0, True)
    assert d[1] == L.MESSAGE_MAGIC_CODE_V2 and d[12] == 1 and d[15] == R3_TOPIC.decode()
    assert k.record_size(0, 10, 137, len(R3_ARGS[13]), True) == 291


def test_decode_vectors(k):
    assert k.decode_record(R1, 0, True) == (
        204, L.MESSAGE_MAGIC_CODE, 1774740973, 3, 0, 42, 1073741824, 0, BORN_TS, BORN, STORE_TS,
        STORE, 0, 0, b"Hello RocketMQ", "TopicTest", PROPS1)
    assert k.decode_record(R1, 0, False)[14] is None
    d = k.decode_record(b"\0" * 5 + R2, 5, True)
    assert d[:9] == (118, L.MESSAGE_MAGIC_CODE, 1406770827, 0, 0, 0, 0, 0x30, 1)
    assert d[9:] == R2_ARGS[6:9] + (0, 0, b"A", "T6", b"")
    assert k.read_store_timestamp(R1, 0) == STORE_TS
    assert k.read_store_timestamp(R2, 0) == 2
    assert k.read_store_timestamp(R1, 170) == -1
    assert k.read_store_timestamp(R1, -1) == -1
    assert k.read_store_timestamp(R1[:60], 0) == -1


def test_read_store_timestamps_reads_each_position_as_read_store_timestamp(k):
    import array

    import numpy as np

    buf = R1 + R2  # a record with an IPv4 born host, then one with an IPv6 one
    positions = array.array("q", [0, len(R1), -1, len(buf) - 10, 10**12, 0])
    out = array.array("q", [7] * 7)  # one more than needed: left alone
    assert k.read_store_timestamps(buf, positions, out) == 6
    assert list(out) == [STORE_TS, 2, -1, -1, -1, STORE_TS, 7]
    assert list(out[:6]) == [k.read_store_timestamp(buf, p) for p in positions]
    pos, ts = np.array([len(R1), 0], dtype=np.int64), np.zeros(2, dtype=np.int64)
    assert k.read_store_timestamps(memoryview(buf), pos.data, ts.data) == 2
    assert ts.tolist() == [2, STORE_TS]
    assert k.read_store_timestamps(buf, b"", bytearray()) == 0
    with pytest.raises(ValueError):
        k.read_store_timestamps(buf, positions, array.array("q", [0] * 5))
    with pytest.raises(BufferError):
        k.read_store_timestamps(buf, positions, bytes(48))
    with pytest.raises(TypeError):
        k.read_store_timestamps(buf, 3, out)


def test_check_vectors(k):
    for rec in (R1, R2, R4):
        for crc, prop in ((False, False), (True, False)):
            assert k.check_record(rec, 0, len(rec), crc, prop, MAX) == len(rec)
    assert k.check_record(R4, 0, len(R4), True, True, MAX) == 180
    assert k.check_record(R1, 0, len(R1), True, True, MAX) == L.REC_PROP_CRC
    assert k.parse_properties(R4[-64:]).get("__CRC32#") == "6291523990"


def test_properties_vector(k):
    assert k.parse_properties(PROPS1) == {
        "KEYS": "key1 key2", "TAGS": "TagA", "UNIQ_KEY": "C0A8010A10921B6D358605265C000001",
        "CLUSTER": "DefaultCluster"}
    p = k.parse_properties(b"A\x01x\x02\x01y\x02B\x01\x02A\x01z\x02C\x01a\x01b\x02\x02D")
    assert p == {"A": "z", "C": "a\x01b"} and list(p) == ["A", "C"]
    assert k.parse_properties(bytearray(b"\xff\x01\xe4\xb8\x02")) == {"\ufffd": "\ufffd"}
    assert k.parse_properties(memoryview(b"k\x01v")) == {"k": "v"}
    assert k.parse_properties(b"") == {}


@pytest.mark.parametrize("data, crc", [(b"Hello RocketMQ", 1774740973), (b"123456789", 1274296614),
                                       (b"Hello World", 1243066710), (b"A", 1406770827), (b"", 0)])
def test_crc_vectors(k, data, crc):
    assert k.masked_crc32(data) == crc
    assert k.masked_crc32(bytearray(b"xx" + data + b"yy"), 2, 2 + len(data)) == crc
    assert k.masked_crc32(memoryview(b"xx" + data), 2) == crc


def test_crc_large_and_ranges(k):
    big = bytes(range(256)) * 1024
    assert k.masked_crc32(big) == _pure.masked_crc32(big)
    for start, end in ((-1, 3), (5, 4), (0, 300000), (2**70, -1), (0, 2**70), (-2**70, 1)):
        with pytest.raises(ValueError):
            k.masked_crc32(big, start, end)
    assert k.masked_crc32(big, len(big), -5) == 0


def test_core_crc_is_zlibs_at_every_length_and_alignment(core):
    """The core's CRC-32 (PCLMULQDQ or ARMv8 instructions where the CPU has
    them, core.CRC32_IMPLEMENTATION) is zlib's, bit for bit, across the
    folding code's block sizes, tails and unaligned starts."""
    import zlib

    rnd = random.Random(7)
    data = rnd.randbytes(1 << 16) + rnd.randbytes(3000)
    for start in range(16):
        for n in list(range(300)) + [511, 512, 513, 1023, 1024, 4095, 4096, 65535, 65536]:
            want = zlib.crc32(data[start : start + n]) & 0x7FFFFFFF
            assert core.masked_crc32(data, start, start + n) == want, (start, n)
    for _ in range(50):
        chunk = rnd.randbytes(rnd.randrange(1, 200_000))
        assert core.masked_crc32(chunk) == zlib.crc32(chunk) & 0x7FFFFFFF
    assert core.CRC32_IMPLEMENTATION in ("hardware", "zlib")


@pytest.mark.parametrize("s, h", [
    ("TopicTest#key1", -1655984460), ("TopicTest#key2", -1655984459),
    ("TopicTest#OrderID001", -1231272886),
    ("TopicTest#C0A8010A10921B6D358605265C000001", -766483385),
    ("polygenelubricants", -2147483648), ("TopicTest#中文", 3389052), ("TopicTest#😀", 4515557),
    ("", 0), ("#", 35), ("TopicTest#Aa", 2744770), ("TopicTest#BB", 2744770), ("TagA", 2598919),
    ("TagB", 2598920), ("*", 42), ("tag1 || tag2", 50908463), ("标签", 857175),
])
def test_java_hash_vectors(k, s, h):
    assert k.java_hash(s) == h
    assert k.index_key_hash(s) == (0 if h == -2**31 else abs(h))


def test_java_hash_types(k):
    class S(str):
        pass

    assert k.java_hash(S("TagA")) == 2598919
    assert k.java_hash("\ud83d\ude00") == k.java_hash("😀")  # a pair in the str is the same units
    assert k.java_hash("é\udc00") == (233 * 31 + 0xDC00)  # lone surrogate: one unit
    for bad in (b"TagA", None, 42):
        with pytest.raises(TypeError):
            k.java_hash(bad)
        with pytest.raises(TypeError):
            k.index_key_hash(bad)


# --- IndexFile vectors ------------------------------------------------------

I1_PUTS = [("TopicTest#key1", 0, 1700000000123), ("TopicTest#key2", 204, 1700000001123),
           ("TopicTest#Aa", 408, 1700000002500), ("TopicTest#BB", 612, 1700000003999),
           ("TopicTest#key1", 816, 1700000005999)]
I1_BYTES = bytes.fromhex(
    "0000018bcfe5687b0000018bcfe57f6f00000000000000000000000000000330000000030000000"
    "6" + "00000000" * 2 + "00000004" "00000002" "00000005" + "00000000" * 3 + "00" * 20
    + "62b4514c" "0000000000000000" "00000000" "00000000"
    + "62b4514b" "00000000000000cc" "00000001" "00000000"
    + "0029e1c2" "0000000000000198" "00000002" "00000000"
    + "0029e1c2" "0000000000000264" "00000003" "00000003"
    + "62b4514c" "0000000000000330" "00000005" "00000001")
INF = 2**63 - 1


def _select(k, buf, key, max_num=64, begin=0, end=INF, hsn=8, idx=6):
    out = []
    assert k.index_select(buf, hsn, idx, key, max_num, begin, end, out) is None
    return out


def test_index_vector_i1(k):
    buf = bytearray(192)
    for key, phy, ts in I1_PUTS:
        assert k.index_put(buf, 8, 6, key, phy, ts) is True
    assert k.index_put(buf, 8, 6, "TopicTest#key3", 1020, 1700000006000) is False
    assert bytes(buf) == I1_BYTES
    for b in (buf, bytes(buf), memoryview(buf)):
        assert _select(k, b, "TopicTest#key1") == [816, 0]
    assert _select(k, buf, "TopicTest#key2") == [204]
    assert _select(k, buf, "TopicTest#Aa") == [612, 408]
    assert _select(k, buf, "TopicTest#BB") == [612, 408]
    assert _select(k, buf, "TopicTest#nokey") == []
    assert _select(k, buf, "TopicTest#key1", begin=1700000004000) == [816]
    assert _select(k, buf, "TopicTest#key1", end=1700000004000) == [0]
    assert _select(k, buf, "TopicTest#key1", max_num=1) == [816]
    out = [1, 2]
    k.index_select(buf, 8, 6, "TopicTest#key1", 3, 0, INF, out)
    assert out == [1, 2, 816]
    # a full file is not written, so read-only memory is fine
    assert k.index_put(bytes(buf), 8, 6, "TopicTest#key3", 1020, 1700000006000) is False


def test_index_vector_i2(k):
    buf = bytearray(192)
    struct.pack_into(">qqqq", buf, 0, 1700000005999, 1700000005999, 816, 816)
    assert k.index_put(buf, 8, 6, "TopicTest#key4", 1020, 1700000009500) is True
    assert k.index_put(buf, 8, 6, "TopicTest#key4", 1224, 1700000012000) is True
    assert buf[:40].hex() == ("0000018bcfe58d1c0000018bcfe596e000000000000003fc00000000000004c8"
                              "0000000100000003")
    assert buf[44:48].hex() == "00000002"
    assert buf[72 + 20:72 + 60].hex() == ("62b4514900000000000003fc0000000300000000"
                                          "62b4514900000000000004c80000000200000001")
    assert _select(k, buf, "TopicTest#key4") == [1224, 1020]
    assert _select(k, buf, "TopicTest#key4", begin=1700000009000, end=1700000010000) == []


def test_index_errors(k):
    for hsn, idx, size in ((8, 6, 191), (0, 6, 192), (8, 0, 192), (-1, 6, 192), (2**70, 1, 192),
                           (1, 2**70, 192)):
        with pytest.raises(ValueError):
            k.index_put(bytearray(size), hsn, idx, "k", 0, 0)
        with pytest.raises(ValueError):
            k.index_select(bytearray(size), hsn, idx, "k", 1, 0, 1, [])
    with pytest.raises(TypeError):
        k.index_put(bytes(192), 8, 6, "k", 0, 0)
    with pytest.raises(TypeError):
        k.index_put(bytearray(192), 8, 6, b"k", 0, 0)
    with pytest.raises(TypeError):
        k.index_select(bytearray(192), 8, 6, None, 1, 0, 1, [])
    buf = bytearray(192)
    k.index_put(buf, 8, 6, "k", 0, 5)
    with pytest.raises(TypeError):
        k.index_put(memoryview(buf).toreadonly(), 8, 6, "k", 0, 5)
    assert len(buf) == 192



def test_index_put_keys_equals_one_put_per_key(k):
    """``index_put_keys`` writes the bytes of one ``index_put(prefix + key)``
    per key, non-ASCII keys included, and stops where the file fills."""
    keys = ["key1", "Aa", "BB", "ключ", "😀x", ""]
    one = bytearray(192)
    stored = 0
    for key in keys:
        if not k.index_put(one, 8, 6, "TopicTest#" + key, 408, 1700000004000):
            break
        stored += 1
    many = bytearray(192)
    assert k.index_put_keys(many, 8, 6, "TopicTest#", keys, 408, 1700000004000) == stored == 5
    assert many == one
    assert k.index_put_keys(many, 8, 6, "TopicTest#", ["more"], 612, 1700000005000) == 0  # full
    assert k.index_put_keys(bytearray(192), 8, 6, "T#", [], 1, 0) == 0
    # records at or below the header's end physical offset are the caller's call
    assert k.index_put_keys(many, 8, 6, "TopicTest#", ["more"], 407, 1700000005000) == -1
    assert k.index_put_keys(many, 8, 6, "TopicTest#", ["more"], 408, 1700000005000) == -2
    assert many == one
    for bad in (("T#", ("a",)), ("T#", ["a", b"b"]), (b"T#", ["a"])):
        buf = bytearray(192)
        with pytest.raises(TypeError):
            k.index_put_keys(buf, 8, 6, *bad, 1, 0)
        assert buf == bytearray(192)  # nothing written before the check
    with pytest.raises(ValueError):
        k.index_put_keys(bytearray(191), 8, 6, "T#", ["a"], 1, 0)
    with pytest.raises(TypeError):
        k.index_put_keys(bytes(192), 8, 6, "T#", ["a"], 1, 0)



def _three_steps(k, cl, cq, ix, args, cq_pos, tags, keys):
    size = k.write_record(cl, 300, *args)
    k.cq_put(cq, cq_pos, args[3], size, tags)
    if ix is not None:
        k.index_put_keys(ix, 8, 6, "TopicTest#", keys, args[3], args[7])
    return size


@pytest.mark.parametrize("args", [R1_ARGS, R1_ARGS[:-1] + (True,), R2_ARGS], ids=["v4", "crc", "v6"])
@pytest.mark.parametrize("with_index", [True, False])
def test_append_dispatch_equals_its_three_steps(k, args, with_index):
    """One call writes the record, its unit and its keys: the bytes of
    write_record + cq_put + index_put_keys."""
    keys = ["uniq", "key1", "ключ"]
    args = args[:3] + (max(args[3], 1000),) + args[4:]  # past the index's end offset (100)
    bufs = [[bytearray(2048), bytearray(200), bytearray(192) if with_index else None] for _ in range(2)]
    for ix in (bufs[0][2], bufs[1][2]):
        if ix is not None:
            k.index_put(ix, 8, 6, "TopicTest#old", 100, args[7] - 5000)
    (cl1, cq1, ix1), (cl2, cq2, ix2) = bufs
    expected = _three_steps(k, cl1, cq1, ix1, args, 40, -7, keys)
    got = k.append_dispatch(cl2, 300, *args, cq2, 40, -7, ix2, 8, 6, "TopicTest#", keys)
    assert got == expected > 0
    assert (cl2, cq2, ix2) == (cl1, cq1, ix1)


def test_append_dispatch_refusals_and_errors_write_nothing(k):
    keys = ["a", "b"]

    def fresh():
        ix = bytearray(192)
        k.index_put(ix, 8, 6, "T#x", 2000, 1)  # end physical offset 2000
        return bytearray(2048), bytearray(200), ix

    def call(cl, cq, ix, phy=1073741824, cq_pos=40, ks=keys, **over):
        args = list(R1_ARGS)
        args[3] = phy
        return k.append_dispatch(cl, 300, *args, cq, cq_pos, 5, ix, 8, 6, "T#", ks)

    bufs = fresh()
    snapshot = [bytes(b) for b in bufs]
    assert call(*bufs, phy=2000) == 0  # at the index's end offset: the caller's steps
    assert call(*bufs, phy=1999) == 0
    assert call(*bufs, ks=["a", "b", "c", "d", "e"]) == 0  # the file cannot take them all
    for bad in (dict(cq_pos=190), dict(cq_pos=-1)):
        with pytest.raises(ValueError):
            call(*bufs, **bad)
    with pytest.raises(TypeError):
        call(*bufs, ks=("a",))
    with pytest.raises(TypeError):
        call(*bufs, ks=["a", 1])
    with pytest.raises(TypeError):
        call(bufs[0], bytes(200), bufs[2])
    with pytest.raises(TypeError):
        call(bufs[0], bufs[1], bytes(bufs[2]))
    with pytest.raises(ValueError):  # the record does not fit
        call(bytearray(400), bufs[1], bufs[2])
    assert [bytes(b) for b in bufs] == snapshot
    # five keys fit exactly when four are free
    assert call(*bufs, ks=["a", "b", "c", "d"]) == 204


def test_append_dispatch_takes_the_first_record_of_a_store_into_an_empty_index_file(k):
    """A new store's first record (physical offset 0) and its first index
    file (end offset 0, no entry): one call, the bytes of the three steps;
    a file holding an entry at 0, or one whose end offset is past 0 (what
    the file before it indexed), refuses it."""
    args = R1_ARGS[:3] + (0,) + R1_ARGS[4:]
    keys = ["uniq", "key1"]
    (cl1, cq1, ix1), (cl2, cq2, ix2) = [[bytearray(2048), bytearray(200), bytearray(192)] for _ in range(2)]
    expected = k.write_record(cl1, 300, *args)
    k.cq_put(cq1, 0, 0, expected, 7)
    for key in keys:  # (index_put_keys leaves a record at the end offset to the careful path)
        assert k.index_put(ix1, 8, 6, "TopicTest#" + key, 0, args[7])
    assert k.append_dispatch(cl2, 300, *args, cq2, 0, 7, ix2, 8, 6, "TopicTest#", keys) == expected > 0
    assert (cl2, cq2, ix2) == (cl1, cq1, ix1)
    assert k.append_dispatch(bytearray(2048), 300, *args, bytearray(200), 0, 7, ix2, 8, 6, "TopicTest#",
                             keys) == 0  # its keys are there already
    ix = bytearray(192)
    ix[24:32] = (5).to_bytes(8, "big")  # a rolled file's header: the end offset of the file before
    assert k.append_dispatch(bytearray(2048), 300, *args, bytearray(200), 0, 7, ix, 8, 6, "T#", keys) == 0



def test_read_record(k):
    """check_record + the PHYSICALOFFSET check + decode_record, in one call."""
    buf = bytearray(1024)
    size = k.write_record(buf, 300, *R1_ARGS)
    phy = R1_ARGS[3]
    assert k.read_record(buf, 300, 1024, phy, 4096, True) == k.decode_record(buf, 300, True)
    assert k.read_record(buf, 300, 1024, phy, 4096, False) == k.decode_record(buf, 300, False)
    assert k.read_record(buf, 300, 1024, phy + 1, 4096, True) == L.REC_BAD_OFFSET
    assert k.read_record(buf, 300, 300 + size - 1, phy, 4096, True) == L.REC_TRUNCATED
    assert k.read_record(buf, 300, 1024, phy, size - 1, True) == L.REC_BAD_SIZE
    assert k.read_record(buf, 0, 1024, 0, 4096, True) == L.REC_BAD_MAGIC
    assert k.read_record(buf, -5, 1024, phy, 4096, True) == L.REC_TRUNCATED
    buf[300 + 96] ^= 0xFF  # a body byte: reads check the body CRC (RocketMQ only checks on recovery)
    assert k.read_record(buf, 300, 1024, phy, 4096, True) == L.REC_BODY_CRC
    with pytest.raises(TypeError):
        k.read_record(buf, 300, 1024, "0", 4096, True)


def test_index_select_corrupt_chain_terminates(k):
    # every entry points at the previous one in a cycle 1 -> 2 -> 1 ...
    buf = bytearray(40 + 4 + 20 * 4)
    struct.pack_into(">ii", buf, 32, 1, 3)
    struct.pack_into(">i", buf, 40, 2)
    h = k.index_key_hash("k")
    struct.pack_into(">iqii", buf, 44 + 20, h, 11, 0, 2)
    struct.pack_into(">iqii", buf, 44 + 40, h, 22, 0, 1)
    out = []
    k.index_select(buf, 1, 4, "k", 100, 0, INF, out)
    assert out == [22, 11, 22, 11]  # bounded by index_num visits


def test_index_select_times_beyond_i64(k):
    # beginTimestamp near Long.MAX_VALUE: decoded times pass 2**63 and must compare exactly
    buf = bytearray(40 + 4 + 20 * 3)
    struct.pack_into(">qqqqii", buf, 0, 2**63 - 1, 0, 0, 0, 1, 3)
    struct.pack_into(">i", buf, 40, 2)
    struct.pack_into(">iqii", buf, 44 + 40, k.index_key_hash("k"), 77, 5, 0)
    for begin, end, expected in ((2**63 + 4998, 2**80, [77]), (2**63 + 4999, 2**63 + 4999, [77]),
                                 (2**63 + 5000, 2**80, []), (0, 2**63 + 4998, []),
                                 (-(2**90), 2**63 - 1, [])):
        assert _select(k, buf, "k", 10, begin, end, 1, 3) == expected, (begin, end)


# --- ConsumeQueue vectors ---------------------------------------------------


def _cq(k, times):
    buf = bytearray(20 * len(times))
    for i in range(len(times)):
        k.cq_put(buf, 20 * i, i * 1000, 10, 0)
    return buf, (lambda phy, size: times[phy // 1000])


@pytest.mark.parametrize("times, table", [
    ([100, 100, 100, 300, 300], {50: (0, 0), 100: (0, 2), 200: (3, 2), 300: (3, 4), 400: (5, 4)}),
    ([100, 200, 300, 400, 500, 600, 700], {250: (2, 1), 260: (2, 1), 701: (7, 6)}),
])
def test_cq_search_time_vectors(k, times, table):
    buf, time_at = _cq(k, times)
    for ts, (lower, upper) in table.items():
        assert k.cq_search_time(buf, 0, 0, len(buf), ts, False, 0, time_at) == lower, ts
        assert k.cq_search_time(buf, 0, 0, len(buf), ts, True, 0, time_at) == upper, ts


def test_cq_units_and_scan(k):
    buf = bytearray(20 * 6 + 7)
    k.cq_put(buf, 0, 0, L.PRE_BLANK_SIZE, 0)
    k.cq_put(buf, 20, 100, 50, -7)
    k.cq_put(buf, 40, 150, 60, 2**63 - 1)
    k.cq_put(buf, 60, 0, L.PRE_BLANK_SIZE, 0)
    assert k.cq_get(buf, 20) == (100, 50, -7)
    assert k.cq_get(bytes(buf), 40) == (150, 60, 2**63 - 1)
    assert k.cq_units(buf, 0, 10**9) == [(0, L.PRE_BLANK_SIZE, 0), (100, 50, -7),
                                         (150, 60, 2**63 - 1), (0, L.PRE_BLANK_SIZE, 0),
                                         (0, 0, 0), (0, 0, 0)]
    assert k.cq_units(buf, 20, 59) == [(100, 50, -7)]
    assert k.cq_units(buf, -1, 100) == [] and k.cq_units(buf, 40, 40) == []
    assert k.cq_scan(buf, 0, len(buf)) == (80, 210)
    assert k.cq_scan(buf, 60, len(buf)) == (80, -1)
    assert k.cq_scan(buf, 0, 30) == (20, -1)
    assert k.cq_scan(buf, -50, 45) == (40, 150)
    assert k.cq_scan(buf, 10**30, 100) == (10**30, -1)
    # with a physical-offset limit: stop at the first unit at or past it (docs/recovery.md#cutting-a-consumequeue)
    assert k.cq_scan(buf, 0, len(buf), 150) == (40, 150)
    assert k.cq_scan(buf, 0, len(buf), 151) == (80, 210)
    assert k.cq_scan(buf, 0, len(buf), 100) == (20, -1)  # only the pre-blank unit is kept
    assert k.cq_scan(buf, 0, len(buf), 0) == (0, -1)
    assert k.cq_scan(buf, 0, len(buf), -10**30) == (0, -1)
    assert k.cq_scan(buf, 0, len(buf), 10**30) == (80, 210)
    k.cq_put(buf, 0, 2**63 - 1, 2**31 - 1, 0)
    assert k.cq_scan(buf, 0, 20) == (20, 2**63 + 2**31 - 2)
    with pytest.raises(TypeError):
        k.cq_put(bytes(40), 0, 1, 1, 1)


# --- records: malformed input -----------------------------------------------


def _patch(rec, fmt, pos, *values):
    b = bytearray(rec)
    struct.pack_into(fmt, b, pos, *values)
    return bytes(b)


def test_check_record_codes(k):
    def chk(b, pos=0, limit=None, crc=True, prop=False, mx=MAX):
        return k.check_record(b, pos, len(b) if limit is None else limit, crc, prop, mx)

    assert chk(R1 + bytes(8), 204) == L.REC_BAD_MAGIC
    assert chk(R1, 200) == L.REC_TRUNCATED
    assert chk(R1, -1) == L.REC_TRUNCATED
    assert chk(R1, 0, 100) == L.REC_TRUNCATED
    assert chk(R1, 0, -(2**70)) == L.REC_TRUNCATED
    assert chk(R1, 2**70) == L.REC_TRUNCATED
    assert chk(R1, 0, 2**70) == 204
    assert chk(_patch(bytes(8), ">ii", 0, 0, L.BLANK_MAGIC_CODE)) == L.REC_BLANK
    assert chk(R1, mx=203) == L.REC_BAD_SIZE
    assert chk(R1, mx=-(2**80)) == L.REC_BAD_SIZE
    assert chk(R1, mx=2**80) == 204
    assert chk(_patch(R1, ">i", 0, 90)) == L.REC_BAD_SIZE
    assert chk(_patch(R1, ">i", 0, 205) + b"\0") == L.REC_LENGTH_MISMATCH
    assert chk(_patch(R1, ">i", 0, 205)) == L.REC_TRUNCATED
    assert chk(_patch(R1, ">i", 84, -1)) == L.REC_BAD_SIZE  # body length
    assert chk(_patch(R1, ">i", 84, 500)) == L.REC_LENGTH_MISMATCH
    assert chk(_patch(R1, ">B", 102, 200)) == L.REC_BAD_SIZE  # v1 topic length > 127
    assert chk(_patch(R1, ">h", 112, -3)) == L.REC_BAD_SIZE  # properties length
    assert chk(_patch(R1, ">h", 112, 89)) == L.REC_LENGTH_MISMATCH
    assert chk(_patch(R1, ">i", 36, 0x10)) == L.REC_LENGTH_MISMATCH  # IPv6 flag moves fields
    assert chk(_patch(R1, ">i", 8, 5)) == L.REC_BODY_CRC
    assert chk(_patch(R1, ">i", 8, 5), crc=False) == 204
    assert chk(_patch(R4, ">B", 100, 0)) == 180  # body byte: property CRC still checked only
    assert chk(_patch(R4, ">B", 100, 0), prop=True) == L.REC_PROP_CRC
    assert chk(_patch(R4, ">B", 175, ord("9")), prop=True) == L.REC_PROP_CRC  # stored digits
    assert chk(_patch(R4, ">B", 165, ord("x")), prop=True) == L.REC_PROP_CRC  # name
    assert chk(_patch(R4, ">B", 179, ord("x")), prop=True) == L.REC_TORN  # blob must end with 0x02
    v2 = k.encode_record(*R3_ARGS)
    assert chk(_patch(v2, ">h", 98, -1)) == L.REC_BAD_SIZE
    assert chk(_patch(v2, ">h", 98, 300)) == L.REC_LENGTH_MISMATCH


def test_decode_record_errors(k):
    for b, pos in ((R1, -1), (R1, 200), (R1, 2**70), (bytes(204), 0), (R1[:203], 0),
                   (_patch(R1, ">i", 0, 90), 0), (_patch(R1, ">i", 84, 1000), 0),
                   (_patch(R1, ">B", 102, 200), 0), (_patch(R1, ">h", 112, 200), 0),
                   (_patch(R1, ">h", 112, -1), 0), (_patch(R1, ">i", 36, 0x30), 0)):
        with pytest.raises(ValueError):
            k.decode_record(b, pos, True)


def test_write_record_errors_write_nothing(k):
    def attempt(buf, pos=0, **kw):
        args = dict(zip(("queue_id", "flag", "queue_offset", "physical_offset", "sys_flag",
                         "born_timestamp", "born_host", "store_timestamp", "store_host",
                         "reconsume_times", "prepared_transaction_offset", "body", "topic",
                         "properties", "append_crc"), R1_ARGS))
        args.update(kw)
        before = bytes(buf)
        with pytest.raises((ValueError, TypeError)) as info:
            k.write_record(buf, pos, **args)
        assert bytes(buf) == before
        return info.type

    buf = bytearray(300)
    assert attempt(buf, 97) is ValueError  # 204 bytes do not fit
    assert attempt(buf, -1) is ValueError
    assert attempt(buf, 2**70) is ValueError
    assert attempt(buf, sys_flag=0x10) is ValueError
    assert attempt(buf, store_host=b"\0" * 20) is ValueError
    assert attempt(buf, topic=b"t" * 32768) is ValueError
    assert attempt(buf, properties=b"p" * 32768) is ValueError
    assert attempt(buf, properties=b"p" * 32748, append_crc=True) is ValueError
    assert attempt(bytes(300)) is TypeError
    assert attempt(memoryview(bytearray(300)).toreadonly()) is TypeError
    assert attempt(bytes(10)) is ValueError  # too small wins over read-only
    assert attempt(buf, body=None) is TypeError
    # the limits themselves are fine
    assert len(k.encode_record(*R1_ARGS[:12], b"t" * 32767, b"p" * 32746, True)) > 65536
    assert len(k.encode_record(*R1_ARGS[:12], b"t" * 32767, b"p" * 32746 + b"\x02", True)) > 65536
    with pytest.raises(ValueError):
        k.encode_record(*R1_ARGS[:12], b"t" * 32767, b"p" * 32747, True)


def test_mmap_views_are_released(k, tmp_path):
    """Every kernel releases its buffer, even on error: an mmap with exported
    buffers could not be closed."""
    path = tmp_path / "store"
    path.write_bytes(bytes(1024))

    def boom(*_):
        raise RuntimeError("boom")

    class BadOut(list):
        def append(self, item):
            raise RuntimeError("boom")

    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        assert k.write_record(mm, 300, *R1_ARGS) == 204
        assert k.check_record(mm, 300, len(mm), True, False, MAX) == 204
        assert k.decode_record(mm, 300, True)[15] == "TopicTest"
        assert k.read_store_timestamp(mm, 300) == STORE_TS
        assert k.masked_crc32(mm, 300 + 88, 300 + 102) == 1774740973
        k.cq_put(mm, 600, 1, 2, 3)
        assert k.cq_get(mm, 600) == (1, 2, 3) and k.cq_units(mm, 600, 620) == [(1, 2, 3)]
        assert k.cq_scan(mm, 600, 640) == (620, 3)
        assert k.index_put(mm, 8, 6, "k", 1, 2) is True
        assert _select(k, mm, "k", begin=0) == [1]
        for call in (lambda: k.cq_search_time(mm, 0, 600, 620, 5, True, 0, boom),
                     lambda: k.index_select(mm, 8, 6, "k", 5, 0, INF, BadOut()),
                     lambda: k.write_record(mm, 1000, *R1_ARGS),
                     lambda: k.decode_record(mm, 0, True)):
            with pytest.raises((RuntimeError, ValueError)):
                call()
        mm.close()  # BufferError if any view leaked
        f.seek(300)
        assert f.read(204) == R1
    with open(path, "rb") as f:
        ro = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for call in (lambda: k.write_record(ro, 300, *R1_ARGS), lambda: k.cq_put(ro, 0, 1, 1, 1),
                     lambda: k.index_put(ro, 8, 6, "k", 1, 2)):
            with pytest.raises(TypeError):
                call()
        assert k.check_record(ro, 300, len(ro), True, False, MAX) == 204
        ro.close()


def test_index_select_custom_out(k):
    class Out:
        def __init__(self):
            self.items = []

        def __len__(self):
            return len(self.items)

        def append(self, x):
            self.items.append(x)

    buf = bytearray(192)
    for key, phy, ts in I1_PUTS:
        k.index_put(buf, 8, 6, key, phy, ts)
    out = Out()
    k.index_select(buf, 8, 6, "TopicTest#Aa", 1, 0, INF, out)
    assert out.items == [612]


# --- errors are raised before anything is written, in both implementations ---


@pytest.mark.parametrize("pos", [-20, -1, 21, 2**70])
def test_cq_bad_position_raises_value_error(k, pos):
    with pytest.raises(ValueError):
        k.cq_get(bytearray(40), pos)
    buf = bytearray(40)
    with pytest.raises(ValueError):
        k.cq_put(buf, pos, 1, 1, 1)
    assert buf == bytearray(40)


@pytest.mark.parametrize("field, value", [(0, 2**31), (2, 2**63), (4, -(2**31) - 1), (9, 2**40),
                                          (10, -(2**63) - 1)])
def test_out_of_range_field_raises_overflow(k, field, value):
    args = list(R1_ARGS)
    args[field] = value
    buf = bytearray(300)
    with pytest.raises(OverflowError):
        k.write_record(buf, 0, *args)
    assert buf == bytearray(300)
    with pytest.raises(OverflowError):
        k.cq_put(buf, 0, 2**63, 1, 1)
    with pytest.raises(OverflowError):
        k.index_put(buf, 1, 1, "k", 0, 2**63)
    assert buf == bytearray(300)


# each side of the digit boundaries (30-bit digits; the core reads ints of up
# to two digits inline), and of the 32- and 64-bit fields
EDGE_INTS = sorted({s * (2**b + d) for b in (0, 15, 30, 31, 45, 59, 60, 62) for d in (-1, 0) for s in (1, -1)}
                   | {0, 2**63 - 1, -(2**63)})


def test_int_fields_read_exactly_across_digit_boundaries(k):
    buf = bytearray(20)
    for v in EDGE_INTS:
        size = v if -(2**31) <= v < 2**31 else 7
        k.cq_put(buf, 0, v, size, -v if v > -(2**63) else 1)
        assert k.cq_get(buf, 0) == (v, size, -v if v > -(2**63) else 1), v
    for v in (2**31, -(2**31) - 1, 2**60, -(2**60)):
        with pytest.raises(OverflowError):
            k.cq_put(buf, 0, 1, v, 1)
    for v in (2**63, -(2**63) - 1, 2**64 + 1):
        with pytest.raises(OverflowError):
            k.cq_put(buf, 0, v, 1, 1)
    for v in (1.0, "1"):
        with pytest.raises(TypeError):
            k.cq_put(buf, 0, v, 1, 1)


def test_cq_search_negative_low(k):
    buf, time_at = _cq(k, [100, 200, 300])
    with pytest.raises(ValueError):
        k.cq_search_time(buf, 0, -20, len(buf), 150, False, 0, time_at)


def test_index_slot_count_wraps(k):
    buf = bytearray(192)
    struct.pack_into(">i", buf, 32, 2**31 - 1)
    assert k.index_put(buf, 8, 6, "k", 1, 2) is True
    assert struct.unpack_from(">i", buf, 32)[0] == -(2**31)


# --- parity: Cython core vs pure twin (hypothesis) --------------------------

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
anypos = st.one_of(st.integers(-30, 400), st.sampled_from([2**63 - 1, 2**63, 2**70, -(2**63), -(2**70)]))


@st.composite
def records(draw):
    v6b, v6s = draw(st.booleans()), draw(st.booleans())
    sys_flag = (draw(i32) & ~0x30) | (0x10 if v6b else 0) | (0x20 if v6s else 0)
    props = draw(st.one_of(st.binary(max_size=80),
                           st.lists(st.sampled_from([b"K", b"v", b"\x01", b"\x02", b"__CRC32#\x01",
                                                     b"0123456789"]), max_size=8).map(b"".join)))
    topic = draw(st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=200)))
    return (draw(i32), draw(i32), draw(i64), draw(i64), sys_flag, draw(i64),
            draw(st.binary(min_size=20 if v6b else 8, max_size=20 if v6b else 8)), draw(i64),
            draw(st.binary(min_size=20 if v6s else 8, max_size=20 if v6s else 8)), draw(i32),
            draw(i64), draw(st.binary(max_size=300)), topic, props, draw(st.booleans()))


@SLOW
@given(rec=records(), pos=st.integers(0, 50), extra=st.integers(0, 30))
def test_parity_encode_decode(core, rec, pos, extra):
    enc = _pure.encode_record(*rec)
    assert core.encode_record(*rec) == enc
    size = len(enc)
    topic, props = rec[12], rec[13]
    field = _pure._encoded_props_len(props, rec[14])
    for kern in (_pure, core):
        assert kern.record_size(rec[4], len(rec[11]), len(topic), field, len(topic) > 127) == size
        buf = bytearray(b"\xa5" * (pos + size + extra))
        assert kern.write_record(buf, pos, *rec) == size
        assert buf[pos:pos + size] == enc and buf[:pos] == b"\xa5" * pos
        assert buf[pos + size:] == b"\xa5" * extra
        # an unterminated property blob (never written by a store) reads as torn
        ok = size if rec[14] or not props or props[-1] == 2 else L.REC_TORN
        assert kern.check_record(buf, pos, len(buf), False, False, MAX) == size
        assert kern.check_record(buf, pos, len(buf), True, False, MAX) == ok
        assert kern.check_record(buf, pos, len(buf), True, rec[14], MAX) == ok
        d = kern.decode_record(buf, pos, True)
        assert d[0] == size and d[1] == (L.MESSAGE_MAGIC_CODE_V2 if len(topic) > 127
                                         else L.MESSAGE_MAGIC_CODE)
        assert d[3:15] == rec[:12]
        assert d[15] == topic.decode("utf-8", "replace")
        assert d[16][:len(props)] == props and len(d[16]) == field
        assert kern.read_store_timestamp(buf, pos) == rec[7]


@given(sys_flag=st.one_of(i32, st.integers(-(2**70), 2**70)),
       lens=st.tuples(*[st.integers(-(2**70), 2**70)] * 3), v2=st.sampled_from([0, 1, True, "", None]))
@FAST
def test_parity_record_size(core, sys_flag, lens, v2):
    assert core.record_size(sys_flag, *lens, v2) == _pure.record_size(sys_flag, *lens, v2)


@SLOW
@given(rec=records(), prefix=st.binary(max_size=8), suffix=st.binary(max_size=8),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
       cut=st.integers(0, 10**6), opts=st.tuples(st.booleans(), st.booleans()),
       mx=st.sampled_from([MAX, 91, 150, 300, 2**80, -1]), dlim=st.integers(-5, 5))
def test_parity_check_corrupt(core, rec, prefix, suffix, flips, cut, opts, mx, dlim):
    b = bytearray(prefix + _pure.encode_record(*rec) + suffix)
    for at, x in flips:
        b[at % len(b)] ^= x
    b = bytes(b[: len(b) - cut % 12]) if cut % 3 == 0 else bytes(b)
    pos = len(prefix)
    for p, lim in ((pos, len(b)), (pos, len(b) + dlim), (pos + dlim, len(b)), (0, len(b))):
        assert core.check_record(b, p, lim, *opts, mx) == _pure.check_record(b, p, lim, *opts, mx)
        assert outcome(core.decode_record, b, p, opts[0]) == outcome(_pure.decode_record, b, p, opts[0])
        assert core.read_store_timestamp(b, p) == _pure.read_store_timestamp(b, p)


magic = st.sampled_from([L.MESSAGE_MAGIC_CODE, L.MESSAGE_MAGIC_CODE_V2, L.BLANK_MAGIC_CODE, 0, 12345])


@SLOW
@given(size=st.one_of(st.integers(0, 400), i32), mg=magic, sf=st.sampled_from([0, 0x10, 0x20, 0x30, -1]),
       tail=st.binary(max_size=400), raw=st.binary(max_size=200), pos=anypos, lim=anypos,
       opts=st.tuples(st.booleans(), st.booleans()), mx=st.sampled_from([MAX, 150, 2**70]))
def test_parity_check_arbitrary(core, size, mg, sf, tail, raw, pos, lim, opts, mx):
    head = struct.pack(">ii", size, mg) + tail[:28] + struct.pack(">i", sf)
    for b in (head + tail[28:], raw, head[:-3]):
        assert core.check_record(b, pos, lim, *opts, mx) == _pure.check_record(b, pos, lim, *opts, mx)
        assert core.check_record(b, 0, len(b), *opts, mx) == _pure.check_record(b, 0, len(b), *opts, mx)
        assert outcome(core.decode_record, b, 0, True) == outcome(_pure.decode_record, b, 0, True)
        assert outcome(core.decode_record, b, pos, False) == outcome(_pure.decode_record, b, pos, False)
        assert core.read_store_timestamp(b, pos) == _pure.read_store_timestamp(b, pos)


@SLOW
@given(raw=st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from([b"\x01", b"\x02", b"a", b"K", b"\xc3", b"\xa9", b"\xe4\xb8", b"\xad",
                              b"\xf0\x9f", b"\x98\x80", b"\xed\xa0\x80", b"\xff", b"\x80", b"\xf4\x90"]),
             max_size=30).map(b"".join)))
def test_parity_parse_properties(core, raw):
    expected = _pure.parse_properties(raw)
    got = core.parse_properties(raw)
    assert got == expected and list(got) == list(expected)
    assert core.parse_properties(bytearray(raw)) == expected
    assert core.parse_properties(memoryview(raw)) == expected


@SLOW
@given(s=st.one_of(st.text(), st.lists(st.integers(0, 0x10FFFF), max_size=40).map(
    lambda cs: "".join(map(chr, cs))), st.lists(st.integers(0xD700, 0xE000), max_size=10).map(
    lambda cs: "".join(map(chr, cs)))))
def test_parity_java_hash(core, s):
    assert core.java_hash(s) == _pure.java_hash(s)
    assert core.index_key_hash(s) == _pure.index_key_hash(s)


@FAST
@given(data=st.binary(max_size=300), start=anypos, end=anypos)
def test_parity_masked_crc32(core, data, start, end):
    assert outcome(core.masked_crc32, data, start, end) == outcome(_pure.masked_crc32, data, start, end)


keys = st.sampled_from(["TopicTest#Aa", "TopicTest#BB", "k1", "k2", "k3", "polygenelubricants", "",
                        "中文", "😀", "AaAa", "BBBB", "AaBB"])


@SLOW
@given(hsn=st.integers(1, 4), idx=st.integers(1, 12), slack=st.integers(0, 30),
       puts=st.lists(st.tuples(keys, i64, st.integers(0, 10**13)), max_size=16),
       begin_ts=st.sampled_from([0, 1, 1700000000000]),
       queries=st.lists(st.tuples(keys, st.integers(-1, 20), st.integers(-(2**64), 10**13),
                                  st.sampled_from([INF, 2**64, 10**12, 1700000004000, -1])), max_size=6))
def test_parity_index_sequences(core, hsn, idx, slack, puts, begin_ts, queries):
    size = 40 + 4 * hsn + 20 * idx + slack
    bp, bc = bytearray(size), bytearray(size)
    struct.pack_into(">q", bp, 0, begin_ts)
    struct.pack_into(">q", bc, 0, begin_ts)
    for key, phy, ts in puts:
        assert core.index_put(bc, hsn, idx, key, phy, ts) == _pure.index_put(bp, hsn, idx, key, phy, ts)
        assert bc == bp
    for key, max_num, begin, end in queries:
        op, oc = [], []
        _pure.index_select(bp, hsn, idx, key, max_num, begin, end, op)
        core.index_select(bc, hsn, idx, key, max_num, begin, end, oc)
        assert oc == op


@st.composite
def garbage_index(draw):
    hsn, idx = draw(st.integers(1, 5)), draw(st.integers(1, 10))
    size = 40 + 4 * hsn + 20 * idx + draw(st.integers(0, 20))
    if draw(st.booleans()):
        return hsn, idx, bytearray(draw(st.binary(min_size=size, max_size=size)))
    small = st.integers(-2, idx + 2)
    buf = bytearray(size)
    struct.pack_into(">qqqqii", buf, 0, draw(st.sampled_from([0, -5, 10**12, 2**63 - 1, -(2**63)])),
                     0, 0, 0, draw(st.integers(-3, 2**31 - 2)), draw(small))
    for s in range(hsn):
        struct.pack_into(">i", buf, 40 + 4 * s, draw(small))
    for e in range(idx):
        struct.pack_into(">iqii", buf, 40 + 4 * hsn + 20 * e,
                         _pure.index_key_hash(draw(keys)) if draw(st.booleans()) else draw(i32),
                         draw(i64), draw(st.sampled_from([-1, 0, 1, 5, 2**31 - 1])), draw(small))
    return hsn, idx, buf


@SLOW
@given(g=garbage_index(), key=keys, max_num=st.integers(-1, 30),
       begin=st.sampled_from([0, -(2**80), 10**12, 2**63 - 1, 2**63 + 10**12, 2**63 + 4999]),
       end=st.sampled_from([INF, 2**80, 10**12 + 5000, 0, -1, 2**63 + 999]), phy=i64,
       ts=st.sampled_from([0, -1, 10**12 + 999, 2**63 - 1, -(2**63), 10**13]))
def test_parity_index_garbage(core, g, key, max_num, begin, end, phy, ts):
    hsn, idx, buf = g
    op, oc = [], []
    _pure.index_select(buf, hsn, idx, key, max_num, begin, end, op)
    core.index_select(bytes(buf), hsn, idx, key, max_num, begin, end, oc)
    assert oc == op
    assume(struct.unpack_from(">i", buf, 32)[0] != 2**31 - 1)  # _pure raises there (see above)
    bc = bytearray(buf)
    assert core.index_put(bc, hsn, idx, key, phy, ts) == _pure.index_put(buf, hsn, idx, key, phy, ts)
    assert bc == buf


units = st.tuples(st.one_of(st.integers(-3, 5000), i64),
                  st.one_of(st.integers(-2, 100), st.just(L.PRE_BLANK_SIZE), i32),
                  st.one_of(st.integers(-1, 1), i64))


@SLOW
@given(us=st.lists(units, max_size=12), tail=st.integers(0, 19), start=anypos, end=anypos)
def test_parity_cq_scan_units(core, us, tail, start, end):
    buf = bytearray(20 * len(us) + tail)
    for i, u in enumerate(us):
        _pure.cq_put(buf, 20 * i, *u)
    bc = bytearray(len(buf))
    for i, u in enumerate(us):
        core.cq_put(bc, 20 * i, *u)
    assert bc == buf
    for s, e in ((start, end), (0, len(buf)), (start, len(buf))):
        assert core.cq_scan(buf, s, e) == _pure.cq_scan(buf, s, e)
        for limit in (end, -start, 2**63, 101):
            assert core.cq_scan(buf, s, e, limit) == _pure.cq_scan(buf, s, e, limit)
        assert core.cq_units(buf, s, e) == _pure.cq_units(buf, s, e)
    for i in range(len(us)):
        assert core.cq_get(buf, 20 * i) == _pure.cq_get(buf, 20 * i)


@SLOW
@given(times=st.lists(st.integers(-1, 12), min_size=1, max_size=14).map(sorted),
       unsorted=st.booleans(), noise=st.lists(st.integers(-1, 12), max_size=14),
       phys=st.lists(st.integers(-5, 30), max_size=14), low=st.integers(0, 300),
       rng=st.one_of(st.integers(-30, 300), st.just(2**70)), ts=st.integers(-2, 14),
       upper=st.booleans(), minphy=st.sampled_from([0, 3, 10, -(2**63), 2**63 - 1]),
       file_start=st.sampled_from([0, 2000, -20, 2**63 - 1, -(2**63), 7]))
def test_parity_cq_search_time(core, times, unsorted, noise, phys, low, rng, ts, upper, minphy,
                               file_start):
    if unsorted:
        times = [n if i < len(noise) and noise[i] > 8 else t for i, (t, n) in
                 enumerate(zip(times, noise + times))]
    buf = bytearray(20 * len(times) + 7)
    table = {}
    for i, t in enumerate(times):
        phy = phys[i] if i < len(phys) else i
        _pure.cq_put(buf, 20 * i, phy, 10 + i, 0)
        table[(phy, 10 + i)] = t
    calls = []

    def time_at(phy, size):
        calls.append((phy, size))
        return table.get((phy, size), 5)  # an unaligned low reads garbage units

    a = _pure.cq_search_time(buf, file_start, low, rng, ts, upper, minphy, time_at)
    pure_calls, calls[:] = list(calls), []
    assert core.cq_search_time(buf, file_start, low, rng, ts, upper, minphy, time_at) == a
    assert calls == pure_calls



@pytest.mark.parametrize("seed", range(25))
def test_cq_search_time_with_a_commitlog_view(k, seed):
    """A CommitLog view (segments' buffers, file size, base, [lo, hi)) gives
    the answers of the equivalent time_at callable, probes outside the view
    (before lo, past hi, past the last segment) answering -1."""
    rnd = random.Random(seed)
    fs, base = 4096, 3 * 4096
    segs = [bytearray(fs) for _ in range(3)]
    units, times, pos, seg = bytearray(), [], 0, 0
    t = 1_700_000_000_000
    while len(times) < 40:
        args = list(R1_ARGS)
        t += rnd.choice([0, 0, 1000, 2500])
        args[3] = base + seg * fs + pos
        args[7] = t
        size = k.write_record(segs[seg], pos, *args)
        units += struct.pack(">qiq", args[3], size, 0)
        times.append(t)
        pos += size
        if pos + size > fs:
            seg, pos = seg + 1, 0
            if seg == len(segs):
                break
    lo = base + rnd.choice([0, 204, 1000])
    hi = base + rnd.choice([2 * fs + 100, 3 * fs, 10 * fs])
    nsegs = rnd.choice([2, 3])
    view = ([bytes(b) for b in segs[:nsegs]], fs, base, lo, hi)

    def time_at(phy, size):
        if phy < lo or phy + size > hi or phy < base or (phy - base) // fs >= nsegs:
            return -1
        return k.read_store_timestamp(segs[(phy - base) // fs], (phy - base) % fs)

    # ints compare in C on a view; anything else (floats, ints past i64, bools) as objects
    odd = [times[3] + 0.5, float(times[4]), 2**70, -(2**70), True]
    for ts in [times[0] - 1, times[-1] + 1] + rnd.sample(times, 5) + odd:
        for upper in (False, True):
            want = k.cq_search_time(units, 0, 0, len(units), ts, upper, lo, time_at)
            assert k.cq_search_time(units, 0, 0, len(units), ts, upper, lo, view) == want
    with pytest.raises(TypeError):
        k.cq_search_time(units, 0, 0, len(units), 5, False, 0, (tuple(view[0]),) + view[1:])
    with pytest.raises(ValueError):
        k.cq_search_time(units, 0, 0, len(units), 5, False, 0, (view[0], 0, base, lo, hi))


# --- a few hostile-argument parity checks -----------------------------------


def test_parity_hostile_buffers(core):
    rnd = random.Random(1)
    for _ in range(200):
        b = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 120)))
        pos = rnd.randrange(-10, 130)
        assert outcome(core.decode_record, b, pos, True) == outcome(_pure.decode_record, b, pos, True)
    for fn, _args in ((lambda m: m.check_record(None, 0, 10, True, False, 10), ()),
                     (lambda m: m.decode_record("x" * 100, 0, True), ()),
                     (lambda m: m.masked_crc32(None), ()),
                     (lambda m: m.parse_properties("a\x01b"), ()),
                     (lambda m: m.encode_record(*R1_ARGS[:11], "body", *R1_ARGS[12:]), ()),
                     (lambda m: m.index_select(bytearray(192), 8, 6, 5, 1, 0, 1, []), ())):
        assert outcome(fn, core) == outcome(fn, _pure)
    assert core.parse_properties([65, 1, 66]) == _pure.parse_properties([65, 1, 66]) == {"A": "B"}


def test_torn_properties_are_caught_only_when_validating(k):
    """A record whose property blob does not end with 0x02 was cut short: with
    CRC checks on (recovery, verify) it is REC_TORN; a plain read passes it."""
    torn = bytearray(R1)
    torn[-1] = 0  # the trailing 0x02 of the last property
    assert k.check_record(torn, 0, len(torn), True, 0, MAX) == L.REC_TORN
    assert k.check_record(torn, 0, len(torn), True, 2, MAX) == L.REC_TORN
    assert k.check_record(torn, 0, len(torn), False, 0, MAX) == len(R1)
    assert k.check_record(R1, 0, len(R1), True, 0, MAX) == len(R1)
