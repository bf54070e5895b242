# The core's classes whose state other kernels read directly (C fields, no
# attribute lookups). Their docstrings and methods are in _core.pyx's units
# (_core_units/state.pxi, message.pxi and gates.pxi); the
# pure-Python twins are in _pure/message.py (Message, MessageExt) and
# the _pure package (the rest). The store's Python classes (MappedFile,
# MappedFileQueue, CommitLog, ConsumeQueue, IndexFile, IndexService)
# subclass the ones they share state through.


cdef class Message:
    # The producer's fields, as given (and as changed after: the put path
    # checks them again from one reading of each). Objects, not C ints, so
    # that assigning a wrong type is caught by the put with the typed error,
    # as for the twin.
    cdef public object topic, body, queue_id, flag, tags, keys, unique_key, properties
    cdef public object born_timestamp, born_host, store_host, reconsume_times, sys_flag
    cdef public object prepared_transaction_offset, delay_level


cdef class MessageExt:
    # A stored record's fields in the order decode_record gives them; the
    # raw hosts and the parsed properties behind properties.
    cdef public object store_size, magic_code, body_crc, queue_id, flag, queue_offset, physical_offset
    cdef public object sys_flag, born_timestamp, store_timestamp, reconsume_times, prepared_transaction_offset
    cdef public object body, topic, properties_blob
    cdef object _born_host, _store_host, _properties


cdef class StoreState:
    # What a put or a read checks and updates on every call, owned here so
    # that the gates read C fields, not the store's attributes.
    cdef public bint closed, disk_full
    cdef public object pending, write_error
    cdef public long long waiting, written_end, last_store_ts, last_logics_ts
    cdef public Py_ssize_t pending_keys


cdef class MappedRegion:
    # A mapped segment as the kernels use it: the mapping, where the file
    # starts in its log, its size and the write position (bytes appended).
    # MappedFile (storage/mapped_file.py) adds the file's lifecycle on top.
    cdef public object mm
    cdef public long long file_from_offset
    cdef public Py_ssize_t file_size, wrote_position


cdef class MappedQueue:
    # A log's segments as the kernels walk them: MappedRegion objects in
    # offset order and their common size in bytes (None: a read-only queue
    # not yet sized). MappedFileQueue (storage/mapped_file.py) adds the directory.
    cdef public list files
    cdef public object file_size


cdef class CommitLogBase:
    # What the read kernels need of a CommitLog: its segments and the
    # largest record size a check accepts (bytes).
    cdef public MappedQueue queue
    cdef public long long max_record_size


cdef class ConsumeQueueBase:
    # A ConsumeQueue as the kernels see it: its files, the first valid
    # unit's byte offset, the physical offset past its last unit's record
    # (-1: none) and the queue it indexes.
    cdef public MappedQueue queue
    cdef public long long min_logic_offset, max_physic_offset
    cdef public str topic
    cdef public int queue_id


cdef class IndexRegion:
    # An index file's mapping and geometry (slots, entries).
    cdef public object mm
    cdef public Py_ssize_t hash_slot_num, index_num


cdef class IndexServiceBase:
    # The index files, oldest first, and the most offsets one lookup reads.
    cdef public list files
    cdef public Py_ssize_t max_msgs_num_batch


cdef class ReferenceResource:
    # Reader references over a store's files: one word changed by atomic
    # operations (the count, and the exclusive bit a clean-up or close
    # sets), so a hold never rests on the GIL; waits happen on cond (a
    # threading.Condition), under which the flags change.
    cdef Py_ssize_t word
    cdef bint cleaning, shut
    cdef object cond
    cdef bint try_hold(self) noexcept
    cdef int drop(self) except -1
    cdef Py_ssize_t _count(self) noexcept
    cdef int _end_cleaning(self) except -1


cdef class StoreCore:
    # The store's gates (PutGate, ReadGate, or the twin's; None when it has
    # none): its put_message and read methods go through them in C.
    cdef public object _put_gate, _read_gate
