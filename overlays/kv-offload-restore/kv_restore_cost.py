# SPDX-License-Identifier: Apache-2.0
"""Restore, scheduler side: does reading a prefix pay against recomputing it?

Both rates are the running engine's own:

- ``ReadRates``: each rank's read rate (bytes/s) and bytes per key, measured
  by its promotion thread over its recent jobs and reported after each one.
  A job is done when its slowest rank is, so the estimate takes the slowest.
- ``PrefillRate``: the engine's prefill seconds per token as a function of
  the context the token attends to, ``a + b * context`` (attention grows with
  the context, the rest does not), fit by weighted least squares over the
  recent steps the scheduler timed (``StepClock``) whose scheduled tokens were
  mostly prefill, the slow outliers (kernel compiles, pauses) dropped.

``weigh`` answers None while either rate is unmeasured: with no evidence the
tier restores, as it always did.
"""

from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from . import kv_restore_reports as reports

PREFILL_SHARE = 0.9  # a step is timed when this share of its tokens is prefill


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
    prefill_steps: int = 0  # steps the prefill fit had, and dropped as outliers
    prefill_trimmed: int = 0
    # The fit (a, b) and the steps it was made from, (tokens, mean context,
    # seconds a token): what a mispredicted recompute is diagnosed from (the
    # GPU suite keeps the last estimate in its results; issue 47).
    prefill_fit: tuple[float, float] | None = None
    prefill_points: tuple[tuple[float, float, float], ...] = ()

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
    """Per-token prefill seconds ``a + b * context``, from timed steps.

    A step is never faster than its work, but often slower: the first steps
    of an engine compile kernels (Triton JIT: seconds for a step of
    milliseconds), and a step's period can include a pause. Those points
    would bend the line (a slow short step at a deep context is read as a
    steep slope, then squared over a long prompt: a 32k-token recompute was
    once predicted at 26,958 s against 5.1 s measured). So the fit drops,
    slowest first, each step the line misses by more than ``OUTLIER`` times
    either way (a line far above a step is one that a slower step pulled up).
    """

    WINDOW = 256  # the recent steps fitted (older ones are forgotten)
    OUTLIER = 3.0

    def __init__(self) -> None:
        self._points: deque[tuple[float, float, float]] = deque(maxlen=self.WINDOW)
        self.steps = 0
        self.trimmed = 0  # steps the last fit dropped
        self._fit: tuple[float, float] | None = None
        self._stale = False

    def observe(self, tokens: int, mean_context: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self._points.append((float(tokens), mean_context, seconds / tokens))
        self.steps += 1
        self._stale = True

    def points(self) -> tuple[tuple[float, float, float], ...]:
        """The steps in the window: (tokens, mean context, seconds a token)."""
        return tuple(self._points)

    def coefficients(self) -> tuple[float, float] | None:
        if self._stale:
            self._fit, self.trimmed = _trimmed_fit(list(self._points), self.OUTLIER)
            self._stale = False
        return self._fit

    def seconds(self, start: int, end: int) -> float | None:
        """Predicted prefill seconds of the tokens from ``start`` to ``end``."""
        fit = self.coefficients()
        if fit is None or end <= start:
            return None
        a, b = fit
        return a * (end - start) + b * (end * end - start * start) / 2


def _line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of per-token seconds on context, weighted by tokens, with
    both coefficients kept >= 0 (more context never makes a token cheaper)."""
    sw = sx = sy = sxx = sxy = 0.0
    for w, x, y in points:
        sw, sx, sy = sw + w, sx + w * x, sy + w * y
        sxx, sxy = sxx + w * x * x, sxy + w * x * y
    spread = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / spread if spread > 1e-9 * sw * sw else 0.0
    if b < 0:
        return sy / sw, 0.0
    a = (sy - b * sx) / sw
    if a < 0:  # the line through the origin that fits best
        return 0.0, (sxy / sxx if sxx > 0 else 0.0)
    return a, b


def _trimmed_fit(
    points: list[tuple[float, float, float]], outlier: float
) -> tuple[tuple[float, float] | None, int]:
    """(a, b) with the slow outliers dropped, and how many were dropped (at
    most half the steps: a majority of them is taken to be sound)."""
    if not points:
        return None, 0
    kept = list(points)
    while True:
        a, b = _line(kept)
        if len(kept) <= max(1, (len(points) + 1) // 2):
            break
        ratios = [y / max(a + b * x, 1e-30) for _, x, y in kept]
        if max(ratios) <= outlier and min(ratios) >= 1 / outlier:
            break
        del kept[ratios.index(max(ratios))]
    return (a, b), len(points) - len(kept)


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
        prefill_steps=min(prefill.steps, prefill.WINDOW),
        prefill_trimmed=prefill.trimmed,
        prefill_fit=prefill.coefficients(),
        prefill_points=prefill.points(),
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
