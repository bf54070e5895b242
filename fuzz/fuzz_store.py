"""atheris target: a read-only store whose one CommitLog segment holds fuzzed bytes."""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from rmqstore import CorruptedFileError, MessageStore

SEGMENT = 4096
ROOT = tempfile.mkdtemp(prefix="rmqstore-fuzz-")
os.makedirs(os.path.join(ROOT, "commitlog"))
PATH = os.path.join(ROOT, "commitlog", "00000000000000000000")


def test_one(data: bytes) -> None:
    with open(PATH, "wb") as fh:
        fh.write(data[:SEGMENT].ljust(SEGMENT, b"\0"))
    try:
        with MessageStore.open(ROOT, read_only=True) as s:
            for m in s.iter_messages():
                assert 0 <= m.physical_offset < SEGMENT
            s.query_messages("T", "k")
    except CorruptedFileError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
