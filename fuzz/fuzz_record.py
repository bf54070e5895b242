"""atheris target: check_record / decode_record / parse_properties on arbitrary bytes."""

import sys

import atheris

with atheris.instrument_imports():
    from rmqstore import _kernels as k
    from rmqstore.format.layout import REC_STATUS_TEXT


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    pos = fdp.ConsumeIntInRange(0, 64)
    mode = fdp.ConsumeIntInRange(0, 2)
    buf = fdp.ConsumeBytes(fdp.remaining_bytes())
    status = k.check_record(buf, pos, len(buf), True, mode, 1 << 22)
    assert status >= 0 or status in REC_STATUS_TEXT, status
    if status > 0:
        fields = k.decode_record(buf, pos, True)
        assert fields[0] == status
        assert isinstance(k.parse_properties(fields[16]), dict)
    else:
        try:
            k.decode_record(buf, pos, True)
        except ValueError:
            pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
