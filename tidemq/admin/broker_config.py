"""A broker group's settings (mqadmin getBrokerConfig/updateBrokerConfig): read from any of its
brokers, changed on its master (its slaves copy the change with the config sync). Mixed into
``AsyncAdmin``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemq.errors import RouteNotFoundError
from tidemq.protos import broker_pb2


@dataclass(frozen=True)
class BrokerSetting:
    key: str
    value: str
    file_value: str  # what the broker's config file and flags say
    changeable: bool  # takes a change without a restart

    @property
    def changed_at_runtime(self) -> bool:
        return self.value != self.file_value

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "file_value": self.file_value,
            "changeable": self.changeable,
        }


def _settings(entries: Any) -> list[BrokerSetting]:
    return [BrokerSetting(e.key, e.value, e.file_value, e.changeable) for e in entries]


class AsyncBrokerConfig:
    if TYPE_CHECKING:

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

        async def cluster_info(self) -> Any: ...

    async def _broker_address(self, broker_group: str, broker_id: int) -> str:
        info = await self.cluster_info()
        for c in info.clusters:
            for g in c.groups:
                if g.broker_name == broker_group and broker_id in g.addresses:
                    return str(g.addresses[broker_id])
        who = "no master" if broker_id == 0 else f"no broker {broker_id}"
        raise RouteNotFoundError(
            f"broker group {broker_group!r} has {who} registered", code="ROUTE_NOT_FOUND"
        )

    async def broker_config(self, broker_group: str, broker_id: int = 0) -> list[BrokerSetting]:
        """Every setting of one broker of the group (default its master)."""
        address = await self._broker_address(broker_group, broker_id)
        r = await self._call(address, "GetBrokerConfig", broker_pb2.GetBrokerConfigRequest())
        return _settings(r.entries)

    async def update_broker_config(
        self, broker_group: str, changes: Mapping[str, str]
    ) -> tuple[list[str], list[BrokerSetting]]:
        """Change settings on the group's master (``key -> value`` as text; "" puts a key back
        to the config file's value): the keys that changed, and the settings named. A bad key
        or value is an InvalidArgumentError naming it, and nothing changed."""
        address = await self._broker_address(broker_group, 0)
        r = await self._call(
            address,
            "UpdateBrokerConfig",
            broker_pb2.UpdateBrokerConfigRequest(changes=dict(changes)),
        )
        return list(r.changed), _settings(r.entries)
