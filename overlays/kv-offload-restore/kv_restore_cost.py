# SPDX-License-Identifier: Apache-2.0
"""Restore, scheduler side: does reading a prefix pay against recomputing it?

Both rates are the running engine's own:

- ``ReadRates``: each rank's read rate (bytes/s) and bytes per key, measured
  by its promotion thread over its recent jobs and reported after each one.
  A job is done when its slowest rank is, so the estimate takes the slowest.
- ``PrefillRate``: the engine's prefill seconds per token as a function of
  the context the token attends to, ``a + b * context`` (attention grows with
  the context, the rest does not), fit by weighted least squares over the
  steps the scheduler timed (``StepClock``) whose scheduled tokens were
  mostly prefill.

``weigh`` answers None while either rate is unmeasured: with no evidence the
tier restores, as it always did.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from . import kv_restore_reports as reports

PREFILL_SHARE = 0.9  # a step is timed when this share of its tokens is prefill
DECAY = 0.98  # weight of past prefill steps per new one (recent ones count more)


@dataclass(frozen=True)
class Estimate:
    """One weighed restore: what it would read, and both predicted times."""

    tokens: int  # prompt tokens the restore would save
    keys: int  # keys to read on each rank
    read_bytes: float  # on the slowest rank
    read_rate: float  # bytes/s of the slowest rank
    read_s: float
    recompute_s: float
    restore: bool  # False: reading is predicted slower than recomputing

    def as_dict(self) -> dict:
        return asdict(self)


class ReadRates:
    def __init__(self) -> None:
        self.rate: dict[int, float] = {}  # rank -> bytes/s
        self.key_bytes: dict[int, float] = {}  # rank -> bytes per key

    def on_report(self, kind: int, value: int) -> None:
        rank, number = reports.split_rank_value(value)
        if kind == reports.READ_RATE:
            self.rate[rank] = float(number)
        elif kind == reports.KEY_BYTES:
            self.key_bytes[rank] = float(number)

    def seconds(self, keys: int, ranks: int) -> tuple[float, float, float] | None:
        """(seconds, bytes, rate) of reading ``keys`` on the slowest rank."""
        measured = [r for r in self.rate if self.rate[r] > 0 and r in self.key_bytes]
        if len(measured) < ranks:
            return None
        slowest = max(measured, key=lambda r: self.key_bytes[r] / self.rate[r])
        nbytes = keys * self.key_bytes[slowest]
        return nbytes / self.rate[slowest], nbytes, self.rate[slowest]


class PrefillRate:
    """Per-token prefill seconds ``a + b * context``, from timed steps."""

    def __init__(self) -> None:
        self._sums = [0.0] * 5  # w, wx, wy, wxx, wxy
        self.steps = 0

    def observe(self, tokens: int, mean_context: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        w, x, y = float(tokens), mean_context, seconds / tokens
        self._sums = [
            s * DECAY + v
            for s, v in zip(self._sums, (w, w * x, w * y, w * x * x, w * x * y))
        ]
        self.steps += 1

    def coefficients(self) -> tuple[float, float] | None:
        sw, sx, sy, sxx, sxy = self._sums
        if self.steps == 0 or sw <= 0:
            return None
        spread = sw * sxx - sx * sx
        b = (sw * sxy - sx * sy) / spread if spread > 1e-9 * sw * sw else 0.0
        b = max(b, 0.0)  # more context never makes a token cheaper
        a = max((sy - b * sx) / sw, 0.0)
        return a, b

    def seconds(self, start: int, end: int) -> float | None:
        """Predicted prefill seconds of the tokens from ``start`` to ``end``."""
        fit = self.coefficients()
        if fit is None or end <= start:
            return None
        a, b = fit
        return a * (end - start) + b * (end * end - start * start) / 2


def weigh(
    rates: ReadRates,
    prefill: PrefillRate,
    ranks: int,
    keys: int,
    start: int,
    end: int,
) -> Estimate | None:
    """Restore ``keys`` keys covering tokens ``start``-``end``, or recompute?"""
    read = rates.seconds(keys, ranks)
    recompute = prefill.seconds(start, end)
    if read is None or recompute is None:
        return None
    read_s, nbytes, rate = read
    return Estimate(
        tokens=end - start,
        keys=keys,
        read_bytes=nbytes,
        read_rate=rate,
        read_s=read_s,
        recompute_s=recompute,
        restore=read_s <= recompute,
    )


class StepClock:
    """Times the scheduler's steps and feeds the prefill ones to a PrefillRate.

    A step's time is taken as the longer of the two periods that follow its
    metadata (to the next step's, and from there to the one after): with
    synchronous scheduling the first is the step's own model time; with
    async scheduling (two steps in flight) the next step is scheduled at once
    and the second period is this step's. The longer one never undercounts a
    step, so the prefill estimate errs towards restoring, never towards a
    miss. A step is timed only if the engine stepped on: some request of it
    is scheduled again in each of the two next steps.
    """

    def __init__(self, prefill: PrefillRate) -> None:
        self.prefill = prefill
        # The last two steps: (time, requests, prefill tokens, mean context).
        self._steps: list[tuple[float, frozenset, int, float]] = []

    def on_step(
        self, now: float, scheduled: Iterable[tuple[str, int, int, int]]
    ) -> None:
        """A step's metadata was built: (request, tokens, computed, prompt)."""
        reqs, total, prefill, weighted = set(), 0, 0, 0.0
        for req_id, n, computed, prompt in scheduled:
            reqs.add(req_id)
            total += n
            p = max(0, min(n, prompt - computed))
            prefill += p
            weighted += p * (computed + p / 2)
        mean = weighted / prefill if prefill else 0.0
        timed = prefill > 0 and prefill >= PREFILL_SHARE * total
        if len(self._steps) == 2:
            (t0, r0, n0, c0), (t1, r1, _, _) = self._steps
            if n0 and r0 & r1 and r1 & reqs:
                self.prefill.observe(n0, c0, max(t1 - t0, now - t1))
        step = (now, frozenset(reqs), prefill if timed else 0, mean)
        self._steps = [*self._steps[-1:], step]
