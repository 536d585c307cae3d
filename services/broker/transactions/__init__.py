"""Transactions: half messages kept out of consumers' sight in ``%SYS%TRANS_HALF`` until the
producer (or the checker, asking the producer's group) commits or rolls them back; every
resolution and check is a record of ``%SYS%TRANS_OP``, so the open transactions are what the two
logs say, on every broker of the group (``log``)."""
