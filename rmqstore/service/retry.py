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
"""

from __future__ import annotations

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

__all__ = ["MAX_RECONSUME_TIMES", "dlq_topic", "retry_topic", "send_back_message"]

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
