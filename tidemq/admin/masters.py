"""Asking every master of the cluster one listing question (pending delayed messages, open
transactions): the answers merged in one order, cut to the caller's limit, with the total the
masters counted. Base of the admin mixins that list across masters."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq.errors import InvalidArgumentError, RouteNotFoundError

T = TypeVar("T")


def check_limit(limit: int) -> None:
    if limit <= 0:
        raise InvalidArgumentError("limit must be > 0", code="INVALID_ARGUMENT")


class AcrossMasters:
    """Mixed into ``AsyncAdmin``, which provides ``_call`` and ``masters``."""

    if TYPE_CHECKING:

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

        async def masters(self, cluster: str | None = None) -> dict[str, str]: ...

    async def _all_masters(self) -> dict[str, str]:
        masters = await self.masters()
        if not masters:
            raise RouteNotFoundError("no master broker in any cluster", code="ROUTE_NOT_FOUND")
        return masters

    async def _list_on_masters(
        self,
        method: str,
        request: Any,
        items: Callable[[Any, str], list[T]],
        order: Callable[[T], Any],
        limit: int,
    ) -> tuple[list[T], int]:
        """``method`` asked of every master (by group name); ``items`` reads an answer's rows
        (with the group's name); the first ``limit`` rows by ``order``, and the sum of the
        answers' totals."""
        found: list[T] = []
        total = 0
        for name, address in sorted((await self._all_masters()).items()):
            resp = await self._call(address, method, request)
            total += resp.total
            found += items(resp, name)
        found.sort(key=order)
        return found[:limit], total
