"""Delayed delivery: messages stored as ``%SYS%TIMER`` records until their time, then put into
their topic by the master.

The pure parts (``delay_levels``, ``recall_handle``, ``events``, ``progress``) decide without
sockets or clocks; ``wheel`` keeps the pending timers on disk so that millions of them do not
grow the heap. Everything that must survive a crash or a failover is records in the CommitLog:
the ``%SYS%TIMER`` records themselves (their ConsumeQueue carries each one's delivery time) and
the ``%SYS%TIMER_LOG`` events; the wheel is a cache rebuilt from them at start and promotion.
"""
