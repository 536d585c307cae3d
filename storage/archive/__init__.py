"""Archive and tiered storage (docs/archive.md): sealed CommitLog files archived to a directory or
an S3-compatible bucket before retention deletes them, and reads past local retention served
from there. ``format`` is the byte format, ``backends`` where objects live, ``segments`` the
archiving, checking and fetching of one file, ``archiver`` the master's pass, ``reader`` the
reads, ``cli`` the operator commands."""
