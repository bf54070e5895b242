"""Retries and dead letters: a consumer hands back a message that failed
(docs/service.md#retries-and-dead-letters).

RocketMQ's consumer sends a failed message back to its broker
(``consumerSendMsgBack``), which stores it again, as a new record:

* in the group's retry topic ``%RETRY%<group>``, queue 0, with the delay
  level ``3 + reconsume times`` (10 s, 30 s, 1 min, ... 2 h; or the level
  the consumer asks for), so it comes back through the delay levels
  (:mod:`rmqstore.service.schedule`) and the group consumes it again;
* once the message has been reconsumed ``max_reconsume_times`` times (16) or
  when the consumer asks for no retry (a level below 0), in the group's
  dead-letter topic ``%DLQ%<group>``, queue 0, which no consumer reads
  unless told to.

The new record (:func:`send_back_message`) keeps the body, flag, sys flag,
born time and born host, and the properties, to which it adds
``RETRY_TOPIC`` (the original topic, kept from the first retry on),
``ORIGIN_MESSAGE_ID`` (the original's msgId, likewise kept), ``WAIT=false``,
``DELAY`` (the level; ``0`` for a dead letter) and ``MAX_RECONSUME_TIMES``;
its reconsume times is the message's + 1.

A consumer in a read-only follower process cannot store the record: it
leaves the send-back in ``config/sendBack/`` (:func:`spool_send_back`) and
the writer's schedule service stores it (:func:`drain_send_backs`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket

from .._pure.message import MessageExt as _PureMessageExt
from ..exceptions import IllegalMessageError, MessageTypeError
from ..format.layout import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_DELAY,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT,
    RETRY_GROUP_TOPIC_PREFIX,
)
from ..message import Message, MessageExt, _check_int
from ..storage.mapped_file import _NOFOLLOW, fsync_dir

__all__ = ["MAX_RECONSUME_TIMES", "dlq_topic", "drain_send_backs", "retry_topic", "send_back_message",
           "spool_send_back"]

log = logging.getLogger("rmqstore.retry")

#: RocketMQ's default ``maxReconsumeTimes`` of a consumer (and
#: ``retryMaxTimes`` of a subscription group)
MAX_RECONSUME_TIMES = 16
_EXT_TYPES = (MessageExt, _PureMessageExt)
#: the delay level of a first retry (RocketMQ: ``3 + reconsume times``)
FIRST_RETRY_LEVEL = 3


def retry_topic(group: str) -> str:
    """``%RETRY%<group>`` (RocketMQ ``MixAll.getRetryTopic``)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>`` (RocketMQ ``MixAll.getDLQTopic``)."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def send_back_message(msg, group: str, delay_level: int = 0, max_reconsume_times: int = MAX_RECONSUME_TIMES):
    """The record a failed message *msg* (a :class:`MessageExt` read from
    the store) is stored again as, for consumer group *group* (see the
    module docstring): ``(Message, is_dead_letter)``.

    Args:
        msg (MessageExt): the message that failed.
        group (str): the consumer group.
        delay_level (int): 0 = RocketMQ's choice (``3 + reconsume times``,
            capped at the last level by the put); above 0 that level;
            below 0 straight to the dead-letter topic.
        max_reconsume_times (int): reconsumes before a dead letter (16).

    Raises MessageTypeError / IllegalMessageError for bad arguments."""
    if not isinstance(msg, _EXT_TYPES):
        raise MessageTypeError(f"expected a MessageExt, got {type(msg).__name__}")
    level = _check_int("delay_level", delay_level)
    most = _check_int("max_reconsume_times", max_reconsume_times, minimum=0)
    if not group or not isinstance(group, str):
        raise IllegalMessageError("group must be a non-empty str")
    props = dict(msg.properties or {})
    props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
    props[PROPERTY_WAIT] = "false"
    dead = msg.reconsume_times >= most or level < 0
    if dead:
        topic = dlq_topic(group)
        props[PROPERTY_DELAY] = "0"
    else:
        topic = retry_topic(group)
        props[PROPERTY_DELAY] = str(level if level > 0 else FIRST_RETRY_LEVEL + msg.reconsume_times)
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
        props[PROPERTY_ORIGIN_MESSAGE_ID] = msg.msg_id
    props[PROPERTY_MAX_RECONSUME_TIMES] = str(most)
    out = Message(
        topic, msg.body, queue_id=0, flag=msg.flag, properties=props, born_timestamp=msg.born_timestamp,
        born_host=msg.born_host, reconsume_times=msg.reconsume_times + 1, sys_flag=msg.sys_flag,
    )
    return out, dead


# --- send-backs from read-only processes ------------------------------------------------------

#: where follower processes leave their send-backs for the writer
SEND_BACK_DIR = os.path.join("config", "sendBack")
_O_FLAGS = _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def spool_send_back(root, group: str, msg, delay_level: int = 0,
                    max_reconsume_times: int = MAX_RECONSUME_TIMES) -> None:
    """Leave the send-back of *msg* for the writer of the store in *root*
    (a follower process cannot store it): one JSON line in
    ``config/sendBack/<host>@<pid>.jsonl``, appended and fsynced under an
    exclusive ``flock`` before this returns, so the caller may then count
    the message as processed. The writer's schedule service stores it
    (:func:`drain_send_backs`) within about a second, or the next writer
    when none runs now. Raises what :func:`send_back_message` raises for
    bad arguments (checked here, before anything is written), OSError."""
    send_back_message(msg, group, delay_level, max_reconsume_times)  # (the checks; the writer builds its own)
    line = json.dumps({"group": group, "offset": msg.physical_offset, "msg_id": msg.msg_id,
                       "delay_level": delay_level, "max_reconsume_times": max_reconsume_times}) + "\n"
    directory = os.path.join(os.fspath(root), SEND_BACK_DIR)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{socket.gethostname()}@{os.getpid()}.jsonl")
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_FLAGS, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # the writer removes a drained file under this lock: then write to a new one
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                data = line.encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
                fsync_dir(directory)
                return
        finally:
            os.close(fd)


def drain_send_backs(store) -> int:
    """The writer's side of :func:`spool_send_back`: store every send-back
    the followers left (as :meth:`Consumer.reconsume_later` would have),
    then remove each file drained, under its lock. Returns how many were
    stored. A request whose record is gone (clean-up) or is another one than
    the follower read is logged and dropped; a line that does not parse (a
    follower killed mid-write, which had not counted the message as
    processed) is dropped. A crash after storing and before removing a file
    stores its send-backs again (at least once). Raises what a put raises
    (the file is kept for the next round)."""
    directory = os.path.join(store.root_dir, SEND_BACK_DIR)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return 0
    done = 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | _O_FLAGS)
        except (FileNotFoundError, OSError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as fh:
                lines = fh.read().splitlines()
            records = []
            for raw in lines:
                try:
                    req = json.loads(raw)
                    ext = store.get_message(int(req["offset"]))
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("%s: a send-back that does not parse (%s); dropped", path, e)
                    continue
                if ext is None or ext.msg_id != req.get("msg_id"):
                    log.warning("%s: send-back of %s: the record is gone; dropped", path, req.get("msg_id"))
                    continue
                try:
                    records.append(send_back_message(ext, req["group"], req.get("delay_level", 0),
                                                     req.get("max_reconsume_times", MAX_RECONSUME_TIMES))[0])
                except (KeyError, MessageTypeError, IllegalMessageError) as e:
                    log.warning("%s: a send-back with bad arguments (%s); dropped", path, e)
            if records:
                store.put_messages(records)  # (all or none: on an error the file stays for the next round)
                done += len(records)
            os.unlink(path)  # (under the lock: a follower that had it open writes to a new file)
        finally:
            os.close(fd)
    return done
