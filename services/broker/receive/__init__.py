"""Receive/ack consumption (issue 19): leases on messages instead of committed offsets.

The pure core (no I/O, no clocks: every function takes ``now_ms``) is ``handle`` (receipt
handles), ``retry_policy`` (backoff), ``events`` (the records of ``%SYS%RECEIVE_LOG`` and their
byte format), ``queue_state`` (one queue's in-flight state machine) and ``states`` (all queues
and their snapshot). The broker's journal and service drive it.
"""
