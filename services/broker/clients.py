"""Clients known to the broker through heartbeats: consumer group members and their
subscriptions. State only; the clock is passed in."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Member:
    client_id: str
    mode: int
    subscriptions: dict[str, str]  # topic -> tag expression
    last_seen_ms: int


@dataclass
class ClientRegistry:
    expiry_ms: int = 120_000
    groups: dict[str, dict[str, Member]] = field(default_factory=dict)

    def heartbeat(
        self, client_id: str, group: str, mode: int, subscriptions: dict[str, str], now_ms: int
    ) -> None:
        self.groups.setdefault(group, {})[client_id] = Member(
            client_id, mode, subscriptions, now_ms
        )

    def unregister(self, client_id: str) -> None:
        for members in self.groups.values():
            members.pop(client_id, None)

    def expire(self, now_ms: int) -> list[str]:
        gone: list[str] = []
        for members in self.groups.values():
            for cid, m in list(members.items()):
                if now_ms - m.last_seen_ms > self.expiry_ms:
                    del members[cid]
                    gone.append(cid)
        return gone

    def members(self, group: str, now_ms: int) -> list[str]:
        return sorted(
            cid
            for cid, m in self.groups.get(group, {}).items()
            if now_ms - m.last_seen_ms <= self.expiry_ms
        )
