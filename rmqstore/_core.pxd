# The core's classes whose state other kernels read directly (C fields, no
# attribute lookups). Their docstrings and methods are in _core.pyx; the
# pure-Python twins are in _pure_message.py.


cdef class Message:
    # The producer's fields, as given (and as changed after: the put path
    # checks them again from one reading of each). Objects, not C ints, so
    # that assigning a wrong type is caught by the put with the typed error,
    # as for the twin.
    cdef public object topic, body, queue_id, flag, tags, keys, unique_key, properties
    cdef public object born_timestamp, born_host, store_host, reconsume_times, sys_flag
    cdef public object prepared_transaction_offset


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


cdef class MappedRegion:
    # A mapped segment as the kernels use it: the mapping, where the file
    # starts in its log, its size and the write position (bytes appended).
    # MappedFile (mapped_file.py) adds the file's lifecycle on top.
    cdef public object mm
    cdef public long long file_from_offset
    cdef public Py_ssize_t file_size, wrote_position
