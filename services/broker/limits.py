"""Limits on what one broker holds (docs/operations.md, "Limits"): refusals that name the limit
and the setting that raises it. Not retriable: the same call fails the same way until an
operator deletes something or raises the setting."""

from __future__ import annotations

import grpc

from tidemq.protos import common_pb2
from tidemq.services.errors import ServiceError

DEFAULT_MAX_TOPICS = 200_000
DEFAULT_MAX_GROUPS = 50_000


class LimitExceededError(ServiceError):
    def __init__(self, message: str) -> None:
        super().__init__(
            grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.LIMIT_EXCEEDED, message, retriable=False
        )


def too_many_topics(topic: str, limit: int) -> LimitExceededError:
    return LimitExceededError(
        f"cannot create topic {topic!r}: this broker holds {limit} topics, its limit "
        f"(max_topics = {limit}; delete unused topics, or raise max_topics / --max-topics)"
    )


def too_many_groups(group: str, limit: int) -> LimitExceededError:
    return LimitExceededError(
        f"cannot create consumer group {group!r}: this broker holds {limit} consumer groups, "
        f"its limit (max_groups = {limit}; delete unused groups with `tidemq consumer-group "
        f"delete`, or raise max_groups / --max-groups)"
    )
