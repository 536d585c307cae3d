"""tidemq: a replicated message broker in the tradition of Apache RocketMQ.

The Python SDK (Producer, Consumer, Admin) arrives with the services; today this package holds
the ``tidemq`` command line.
"""

__version__ = "0.1.0"
