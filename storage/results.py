"""Outcomes of a put that are values, not errors (RocketMQ's PutMessageStatus): the message is
stored in every case, but a durability promise may not have been met."""

from __future__ import annotations

import enum


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
