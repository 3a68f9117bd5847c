"""Timed rounds taken in turn by engines that share one GPU (the interleaved tier-cost judge).

Engines that each boot once, side by side, then time their rounds one at a time. With
three engines the order rotates: rounds 0-2 take ``order`` rotated by 0, 1, 2 (off on ref,
on ref off, ref off on), rounds 3-5 the reversed order rotated the same way (ref on off,
on off ref, off ref on), and so on. Over every six rounds each engine takes each place
twice, each one goes first in a pair as often as the other, and no engine times two turns
in a row, so neither the machine's drift nor whoever ran just before lands on one side of
a pair (an earlier order, off on ref then ref on off, always put "on" in the middle).
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

    def sequence(self, rnd: int) -> list[str]:
        """The roles in the order they time round ``rnd``."""
        n = len(self.order)
        base = self.order if (rnd // n) % 2 == 0 else self.order[::-1]
        return base[rnd % n :] + base[: rnd % n]

    def index(self, rnd: int) -> int:
        """The turn this engine's round ``rnd`` is, counted from 0 over every engine."""
        return rnd * len(self.order) + self.sequence(rnd).index(self.role)

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
