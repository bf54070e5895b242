"""The reader process of tests/test_soak.py: follows a live store read-only
for a while, checks every message against ``body_of`` and prints a JSON
summary. Usage: ``soak_reader.py <store> <seconds> <queues>``."""

import json
import sys
import time


def body_of(i: int) -> bytes:
    """The body of message *i* (the writer in test_soak.py uses this too)."""
    return (f"{i:08d}:".encode() * 60)[: 40 + (i * 7919) % 500]


def main(root: str, seconds: float, queues: int) -> None:
    from rmqstore import GetMessageStatus, MessageStore

    seen = bad = 0
    errors: list = []
    offs = {q: 0 for q in range(queues)}
    deadline = time.monotonic() + seconds
    with MessageStore.open(root, read_only=True) as ro:
        print("ready", flush=True)
        while time.monotonic() < deadline:
            for q in range(queues):
                try:
                    r = ro.get_messages("SoakTopic", q, offs[q], 32, wait_ms=5)
                except Exception as e:  # noqa: BLE001 - reported, not raised: the summary counts them
                    errors.append(repr(e))
                    continue
                for m in r.messages:
                    i = int(m.keys)
                    if m.body != body_of(i) or i % queues != q or m.queue_offset < offs[q]:
                        bad += 1
                    seen += 1
                if r.messages or r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                    offs[q] = max(offs[q], r.next_begin_offset)
    print(json.dumps({"seen": seen, "bad": bad, "errors": errors[:5], "n_errors": len(errors)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
