"""atheris target: IndexFile select/put chain walks over an arbitrary index buffer."""

import sys

import atheris

with atheris.instrument_imports():
    from rmqstore import _kernels as k

SLOTS, ENTRIES = 8, 32
SIZE = 40 + 4 * SLOTS + 20 * ENTRIES


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    key = fdp.ConsumeUnicodeNoSurrogates(12)
    begin = fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
    end = fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
    max_num = fdp.ConsumeIntInRange(0, 100)
    buf = bytearray(fdp.ConsumeBytes(SIZE).ljust(SIZE, b"\0"))
    out: list = []
    k.index_select(buf, SLOTS, ENTRIES, key, max_num, begin, end, out)
    assert len(out) <= max(max_num, 0)
    k.index_put(buf, SLOTS, ENTRIES, key, 1234, 1700000000000)
    out2: list = []
    k.index_select(buf, SLOTS, ENTRIES, key, 64, 0, 2**63 - 1, out2)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
