"""The two kinds of offset. Mixing a CommitLog byte offset with a ConsumeQueue index is the classic
bug of this design, so they are distinct types for mypy (and plain ints at run time)."""

from typing import NewType

PhyOffset = NewType("PhyOffset", int)
"""A global byte offset into the CommitLog."""

QueueOffset = NewType("QueueOffset", int)
"""A logical message index inside one ConsumeQueue (entry number, not bytes)."""
