"""The RocketMQ 5 protocol (``apache.rocketmq.v2.MessagingService``): a thin adapter over the
broker's own handlers, so the official clients use the same store and semantics."""
