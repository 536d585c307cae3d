"""Idempotent sends: a producer id, an epoch and a sequence per (topic, queue) on every message,
so that a retried send is answered with its first store's result instead of being stored again.

``table`` holds the rules (pure), ``stamp`` the property each stored record carries,
``log_scan`` rebuilds and follows the table from the CommitLog, ``sends`` is the send path's
view of it.
"""
