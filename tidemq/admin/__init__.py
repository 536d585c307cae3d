"""Administration: ``AsyncAdmin`` (asyncio) and ``Admin`` (blocking) in ``admin``; the shape
of the cluster status they report in ``status``."""

from tidemq.admin.admin import Admin, AsyncAdmin, QueueStatus

__all__ = ["Admin", "AsyncAdmin", "QueueStatus"]
