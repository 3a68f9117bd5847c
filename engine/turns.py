"""Timed rounds taken in turn by engines that share one GPU (the interleaved tier-cost judge).

Engines that each boot once, side by side, then time their rounds one at a time in a fixed
order: round 0 in ``order``, round 1 reversed, and so on (off on ref, ref on off, ...), so a
drift of the machine over the minute cancels out of each pair instead of landing on one side.
They agree through a folder: ``ready.<role>`` once an engine is warmed up, and ``step``, the
number of turns taken so far, which the engine whose turn ended advances.
"""

from __future__ import annotations

import os
import time


class TurnTimeout(RuntimeError):
    pass


class Turns:
    def __init__(self, folder: str, role: str, order: list[str], wait_s: float = 300.0):
        if role not in order or len(set(order)) != len(order):
            raise ValueError(f"turns: role {role!r} not once in {order}")
        self.folder, self.role, self.order, self.wait_s = folder, role, order, wait_s
        os.makedirs(folder, exist_ok=True)

    def ready(self) -> None:
        """This engine is warmed up; no turn starts before every engine is."""
        self._write(f"ready.{self.role}", "1")

    def index(self, rnd: int) -> int:
        """The turn this engine's round ``rnd`` is, counted from 0 over every engine."""
        order = self.order if rnd % 2 == 0 else self.order[::-1]
        return rnd * len(self.order) + order.index(self.role)

    def wait(self, rnd: int) -> float:
        """Blocks until round ``rnd`` is this engine's turn; the seconds waited."""
        t0 = time.monotonic()
        want = self.index(rnd)
        while not (self._all_ready() and self._step() == want):
            if time.monotonic() - t0 > self.wait_s:
                raise TurnTimeout(
                    f"turns: {self.role} waited {self.wait_s:g} s for turn {want} in "
                    f"{self.folder} (step {self._step()}, ready {self._ready_roles()})"
                )
            time.sleep(0.02)
        return time.monotonic() - t0

    def done(self, rnd: int) -> None:
        """Round ``rnd`` ended: the next turn is the next engine's."""
        self._write("step", str(self.index(rnd) + 1))

    def _ready_roles(self) -> list[str]:
        return [r for r in self.order if os.path.exists(self._path(f"ready.{r}"))]

    def _all_ready(self) -> bool:
        return len(self._ready_roles()) == len(self.order)

    def _step(self) -> int:
        try:
            with open(self._path("step")) as f:
                return int(f.read())
        except FileNotFoundError:
            return 0

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _write(self, name: str, text: str) -> None:
        tmp = self._path(f".{name}.{self.role}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self._path(name))  # a reader sees the old text or the new
