"""On-disk layout constants of Apache RocketMQ's store (docs/format.md).

Every number here is defined once; the Cython core declares the same values
as C constants and ``tests/test_kernels.py`` checks that they agree.
"""

# --- CommitLog record (docs/format.md#commitlog-record) -------------------
MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7, v1: 1-byte topic length
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB, v2: 2-byte topic length
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194, end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8
#: smallest legal record: IPv4 hosts, v1, empty body, topic and properties
MIN_RECORD_SIZE = 91
#: the whole record may exceed the body limit by this much (RocketMQ >= 4.9.4)
RECORD_SIZE_SLACK = 65536
MAX_PROPERTIES_LENGTH = 32767
MAX_TOPIC_LENGTH_V1 = 127
MAX_TOPIC_LENGTH_V2 = 32767

# fixed field positions (IPv4 born host; later fields move with host widths)
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48

# --- SYSFLAG bits (docs/format.md#sysflag-bits) ---------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20

# --- properties (docs/format.md#properties, docs/format.md#crc32-property) ---
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_WAIT = "WAIT"
PROPERTY_CRC32 = "__CRC32#"
CRC32_RESERVED_LEN = 20  # "__CRC32#" + 0x01 + 10 digits + 0x02
KEY_SEPARATOR = " "
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: a consumer group's retry and dead-letter topics are these prefixes + the group (RocketMQ MixAll)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

# --- ConsumeQueue (docs/format.md#consumequeue-unit) ----------------------
CQ_STORE_UNIT_SIZE = 20
#: placeholder unit written below a queue's first real entry (docs/format.md#pre-blank-unit)
PRE_BLANK_SIZE = 0x7FFFFFFF

# --- IndexFile (docs/format.md#indexfile) ---------------------------------
INDEX_HEADER_SIZE = 40
INDEX_HASH_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20

# --- checkpoint (docs/format.md#checkpoint) -------------------------------
CHECKPOINT_FILE_SIZE = 4096

# --- kernel status codes returned by check_record --------------------------
#: check_record returns the record size (> 0), REC_BLANK for the END_OF_FILE
#: record, or one of the negative codes below.
REC_BLANK = 0
REC_TRUNCATED = -1  # fewer bytes left than the header or TOTALSIZE says
REC_BAD_MAGIC = -2  # unknown magic code (zeros: end of written data)
REC_BAD_SIZE = -3  # TOTALSIZE or a length field outside its legal range
REC_LENGTH_MISMATCH = -4  # TOTALSIZE differs from the length formula
REC_BODY_CRC = -5  # BODYCRC differs from the body's masked CRC32
REC_PROP_CRC = -6  # __CRC32# property missing or wrong
REC_TORN = -7  # properties do not end with 0x02: a record cut short (checked with CRCs)
REC_BAD_OFFSET = -8  # PHYSICALOFFSET differs from where the record lies (decode_columns)
#: decode_columns also stops with one of these (besides REC_BLANK and the codes above)
STOP_LIMIT = 1  # max_count records decoded; more may follow at next_pos
STOP_END = 2  # reached the caller's end position

REC_STATUS_TEXT = {
    REC_TRUNCATED: "record runs past the end of the data",
    REC_BAD_MAGIC: "unknown magic code",
    REC_BAD_SIZE: "record or field length out of range",
    REC_LENGTH_MISMATCH: "TOTALSIZE differs from the record's field lengths",
    REC_BODY_CRC: "body CRC mismatch",
    REC_PROP_CRC: "__CRC32# property missing or mismatched",
    REC_TORN: "properties do not end with 0x02 (a torn record)",
    REC_BAD_OFFSET: "PHYSICALOFFSET differs from the record's position",
}

# --- names in a store directory ------------------------------------------------
MAX_QUEUE_ID = (1 << 31) - 1


def is_offset_name(name: str) -> bool:
    """Whether a directory entry names a segment or index file: ASCII digits
    only (``str.isdigit`` also takes other scripts' digits and superscripts,
    which are no store file's name)."""
    return name.isascii() and name.isdigit()


def queue_id_of(name: str):
    """The queue id a ConsumeQueue directory's name stands for, or None for
    a name that is none: a queue's directory is its id in canonical
    decimal ("0", "17"; not "017", "+1" or "١٧"), 0..2**31-1."""
    if not is_offset_name(name) or (len(name) > 1 and name[0] == "0") or len(name) > 10:
        return None
    qid = int(name)
    return qid if qid <= MAX_QUEUE_ID else None

# decode_columns' string columns that its with_hosts and with_keys flags govern
HOST_COLUMNS = ("born_host", "store_host", "msg_id")
KEY_COLUMNS = ("tags", "keys", "unique_key")

#: numpy record fields of a ConsumeQueue unit, big-endian and packed
#: (docs/format.md#consumequeue-unit): physical offset, size, tags code
CQ_UNIT_FIELDS = [("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")]
#: numpy record fields of an IndexFile entry (docs/format.md#index-entries): key
#: hash, physical offset, seconds after the file's begin timestamp, previous entry number
INDEX_ENTRY_FIELDS = [("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")]
