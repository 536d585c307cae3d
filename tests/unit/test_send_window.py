"""The RocketMQ benchmark's send window (``bench/send_window.py``): both protocols are loaded
through it, so "the same concurrency" holds only if it never lets more than its size go
unanswered, and its figures count every answer once, failures by their kind."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ANSWER_AFTER_S = 0.002


def _send_window() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "send_window.py"
    spec = importlib.util.spec_from_file_location("send_window", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


send_window = _send_window()


class Answered:
    """A future answered later, by the fake client's thread (a callback added after the
    answer runs at once, as a real future's does)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.lock = threading.Lock()
        self.done = False
        self.callbacks: list[Any] = []

    def add_done_callback(self, fn: Any) -> None:
        with self.lock:
            if not self.done:
                self.callbacks.append(fn)
                return
        fn(self)

    def answer(self) -> None:
        with self.lock:
            self.done = True
            callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn(self)

    def exception(self) -> BaseException | None:
        return self.error


class FakeClient:
    """Answers each send from a thread of its own (oldest first); records the most sends it
    ever had unanswered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.unanswered: list[Answered] = []
        self.most_unanswered = 0

    def send_async(self, item: Any) -> Answered:
        if item == "refused":
            raise ValueError("refused at once")
        f = Answered(RuntimeError("failed") if item == "fails" else None)
        with self.lock:
            self.unanswered.append(f)
            self.most_unanswered = max(self.most_unanswered, len(self.unanswered))
        threading.Thread(target=self.answer_one).start()
        return f

    def answer_one(self) -> None:
        # A little later than at once: a window that let more through would be seen doing it.
        time.sleep(ANSWER_AFTER_S)
        with self.lock:
            f = self.unanswered.pop(0)
        f.answer()


def test_window_keeps_at_most_its_size_unanswered_and_counts_each_answer() -> None:
    client = FakeClient()
    window = send_window.Window(3)
    items = ["ok"] * 200 + ["fails"] * 5 + ["refused"] * 2
    figures = send_window.measured(window, client.send_async, items)
    assert client.most_unanswered <= 3
    assert figures["statuses"] == {"SEND_OK": 200, "RuntimeError": 5, "ValueError": 2}
    assert (figures["messages"], figures["concurrency"]) == (207, 3)
    assert len(window.latencies_s) == 207
    assert 0 < figures["p50_us"] <= figures["p99_us"]
