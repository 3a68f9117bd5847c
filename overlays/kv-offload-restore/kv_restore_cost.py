# SPDX-License-Identifier: Apache-2.0
"""Restore, scheduler side: does reading a prefix pay against recomputing it?

Both rates are the running engine's own:

- ``ReadRates``: each rank's read rate (bytes/s) and bytes per key, measured
  by the store library over its recent jobs and reported after each one.
  A job is done when its slowest rank is, so the estimate takes the slowest.
- ``PrefillRate``: the engine's seconds for a prefill step, ``c + a * tokens
  + b * tokens * context`` (a step's fixed cost, a token's, and attention,
  which grows with the context), fit by least squares of the relative error
  over the recent steps the scheduler timed (``StepClock``) whose scheduled
  tokens were mostly prefill, the outliers (kernel compiles, pauses) dropped.

``weigh`` answers None while either rate is unmeasured, or while the steps
seen are too short to predict a prefill's (``PrefillRate.REACH``): with no
evidence the tier restores, as it always did.
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
    # The fit (c, a, b) and the steps it was made from, (tokens, mean
    # context, seconds): what a mispredicted recompute is diagnosed from (the
    # GPU suite keeps the last estimate in its results; issue 47).
    prefill_fit: tuple[float, float, float] | None = None
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
    """A prefill step's seconds ``c + a * tokens + b * tokens * context``,
    from timed steps.

    ``c`` is what a step costs whatever it holds (the launch of every layer's
    kernels, the sampler, the scheduler), ``a`` what a token costs, ``b`` what
    a token costs per token of context it attends to. A per-token line alone
    reads a step's fixed cost as a token's: on the GPU the steps timed before
    the first restore were tails of 48-144 tokens, about 33 ms each, and a
    32k-token recompute was predicted at 15 s against 4.8 s measured (run 22).

    A step is never faster than its work, but often slower: the first steps
    of an engine compile kernels (Triton JIT: seconds for a step of
    milliseconds), and a step's period can include a pause. So the fit drops
    each step the model misses by more than ``OUTLIER`` times either way, and
    never more than half of them.

    A prediction is made only where the steps seen reach the steps it is of:
    the largest timed step must hold at least ``1 / REACH`` of the tokens a
    step of the prediction holds (``chunk``, vLLM's max_num_batched_tokens, or
    the whole prefill when shorter). A fit from short steps cannot tell a
    token's cost from a step's, and an estimate it cannot make is one the
    tier does not act on: it restores, as with no estimate at all.
    """

    WINDOW = 256  # the recent steps fitted (older ones are forgotten)
    OUTLIER = 3.0
    REACH = 4.0

    def __init__(self, chunk: int | None = None) -> None:
        self.chunk = chunk  # tokens a prefill step holds at most; None: unknown
        self._points: deque[tuple[float, float, float]] = deque(maxlen=self.WINDOW)
        self.steps = 0
        self.trimmed = 0  # steps the last fit dropped
        self._fit: tuple[float, float, float] | None = None
        self._stale = False

    def observe(self, tokens: int, mean_context: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self._points.append((float(tokens), float(mean_context), float(seconds)))
        self.steps += 1
        self._stale = True

    def points(self) -> tuple[tuple[float, float, float], ...]:
        """The steps in the window: (tokens, mean context, seconds)."""
        return tuple(self._points)

    def coefficients(self) -> tuple[float, float, float] | None:
        """(c, a, b) of the fit, or None before any step."""
        if self._stale:
            self._fit, self.trimmed = _trimmed_fit(list(self._points), self.OUTLIER)
            self._stale = False
        return self._fit

    def seconds(self, start: int, end: int) -> float | None:
        """Predicted prefill seconds of the tokens from ``start`` to ``end``,
        or None when no fit reaches steps of that size."""
        fit = self.coefficients()
        if fit is None or end <= start:
            return None
        tokens = end - start
        step = min(self.chunk or tokens, tokens)
        if max(n for n, _, _ in self._points) * self.REACH < step:
            return None
        c, a, b = fit
        steps = -(-tokens // step)
        return c * steps + a * tokens + b * (end * end - start * start) / 2


# The fit's terms, simplest first: among fits that explain the steps equally
# well the first wins (one step of 4,800 tokens is read as 4,800 tokens' cost,
# not as one step's). Every fit has the per-token term: a longer prefill
# always costs more, and a fit without it (a step's cost alone, say) would
# predict that it does not.
_TERMS = ((1,), (0, 1), (1, 2), (0, 1, 2))


def _features(n: float, ctx: float) -> tuple[float, float, float]:
    return 1.0, n, n * ctx


def _solve(rows: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly)
    singular: the steps cannot tell these terms apart."""
    k = len(rhs)
    m = [row[:] + [rhs[i]] for i, row in enumerate(rows)]
    size = max(abs(m[i][i]) for i in range(k))
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-9 * size:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, k):
            f = m[r][col] / m[col][col]
            for j in range(col, k + 1):
                m[r][j] -= f * m[col][j]
    x = [0.0] * k
    for r in reversed(range(k)):
        x[r] = (m[r][k] - sum(m[r][j] * x[j] for j in range(r + 1, k))) / m[r][r]
    return x


class _Normal:
    """The normal equations of the relative least squares over a set of steps
    (rows ``f / seconds`` against 1, ``f`` the terms scaled to at most 1 over
    the steps, so that one step's constant and a deep step's tokens * context
    solve alike), kept as sums: dropping an outlier subtracts its share, and
    a fit's error follows from the sums, so trimming a window of 256 steps
    stays a few milliseconds on the scheduler's thread."""

    def __init__(self, points: list[tuple[float, float, float]]) -> None:
        self.scale = [
            max(max(_features(n, c)[j] for n, c, _ in points), 1e-30) for j in range(3)
        ]
        self.ata = [[0.0] * 3 for _ in range(3)]
        self.atb = [0.0] * 3
        self.count = 0
        for n, c, s in points:
            self.add(n, c, s, 1)

    def row(self, n: float, ctx: float, s: float) -> list[float]:
        return [v / self.scale[j] / s for j, v in enumerate(_features(n, ctx))]

    def add(self, n: float, ctx: float, s: float, sign: int) -> None:
        r = self.row(n, ctx, s)
        for i in range(3):
            self.atb[i] += sign * r[i]
            for j in range(3):
                self.ata[i][j] += sign * r[i] * r[j]
        self.count += sign

    def best(self) -> tuple[float, float, float]:
        """The fit over each set of terms whose coefficients are all >= 0
        (a step never gets cheaper with more tokens or more context) that
        explains the steps best; a richer one must be clearly better."""
        found: tuple[float, list[float]] | None = None
        for terms in _TERMS:
            ata = [[self.ata[i][j] for j in terms] for i in terms]
            atb = [self.atb[i] for i in terms]
            x = _solve(ata, atb)
            if x is None or min(x) < 0:
                continue
            # sum of (row . x - 1)^2, from the sums
            err = self.count - 2 * sum(a * b for a, b in zip(x, atb, strict=True))
            err += sum(
                x[i] * ata[i][j] * x[j] for i in range(len(x)) for j in range(len(x))
            )
            if found is None or err < found[0] - 1e-9 * max(1, self.count):
                coef = [0.0, 0.0, 0.0]
                for i, term in enumerate(terms):
                    coef[term] = x[i] / self.scale[term]
                found = (err, coef)
        assert found is not None  # the per-token term alone always fits
        c, a, b = found[1]
        return c, a, b


def _predict(coef, n: float, ctx: float) -> float:
    return sum(c * f for c, f in zip(coef, _features(n, ctx), strict=True))


def _trimmed_fit(
    points: list[tuple[float, float, float]], outlier: float
) -> tuple[tuple[float, float, float] | None, int]:
    """(c, a, b) with the outliers dropped, and how many were dropped (the
    worst first, at most half the steps: a majority of them is taken to be
    sound). Each round refits and drops the worse half of the steps the fit
    misses by more than ``outlier`` (at least the worst one): a few rounds
    for a window full of compiles, not one a step."""
    if not points:
        return None, 0
    normal = _Normal(points)
    kept = list(points)
    floor = max(1, (len(points) + 1) // 2)
    while True:
        coef = normal.best()
        if len(kept) <= floor:
            break
        off = []
        for i, (n, ctx, s) in enumerate(kept):
            r = s / max(_predict(coef, n, ctx), 1e-30)
            if max(r, 1 / r) > outlier:
                off.append((max(r, 1 / r), i))
        if not off:
            break
        off.sort(reverse=True)
        drop = sorted((i for _, i in off[: min(max(1, len(off) // 2), len(kept) - floor)]),
                      reverse=True)  # fmt: skip
        for i in drop:
            normal.add(*kept.pop(i), -1)
    return coef, len(points) - len(kept)


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
