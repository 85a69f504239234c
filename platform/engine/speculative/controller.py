"""The K controller: how many drafts each request verifies this step, from a fitted step-cost
model T(n) = c0 + c1 * n (n: tokens in the forward) and each request's recent acceptance.

A draft at depth i of a request with acceptance rate a is worth a**i expected tokens and costs
c1 seconds of step time; drafts are added best first while they raise the step's tokens per
second, so K = 0 wherever the fixed cost c0 no longer dominates (large batches) or acceptance
is low.
"""

from __future__ import annotations

import heapq

PRIOR_TOKENS_PER_FIXED_COST = 16.0  # before measuring: one step's fixed cost ~ 16 tokens' work
DECAY = 0.97  # weight of older step measurements per new one
ACCEPT_EMA = 0.3  # weight of the newest acceptance observation
ACCEPT_PRIOR = 0.6  # a request's acceptance rate before its first verification


class StepCostModel:
    """Exponentially weighted least squares of step seconds on forward tokens."""

    def __init__(self) -> None:
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Add one step's measurement."""
        d = DECAY
        self._w = self._w * d + 1.0
        self._n = self._n * d + num_tokens
        self._t = self._t * d + seconds
        self._nn = self._nn * d + num_tokens * num_tokens
        self._nt = self._nt * d + num_tokens * seconds

    def coefficients(self) -> tuple[float, float] | None:
        """(c0, c1) in seconds, None before any measurement. Without enough spread of step
        sizes to fit a slope, the prior ratio c0 = PRIOR * c1 splits the mean cost."""
        if self._w == 0.0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n > 0.25 * max(1.0, mean_n):
            c1 = (self._nt / self._w - mean_n * mean_t) / var_n
            c0 = mean_t - c1 * mean_n
            if c1 > 0.0 and c0 >= 0.0:
                return c0, c1
        c1 = mean_t / (PRIOR_TOKENS_PER_FIXED_COST + mean_n)
        return PRIOR_TOKENS_PER_FIXED_COST * c1, c1


class Controller:
    """Picks K per request per step within [k_min, k_max]."""

    def __init__(self, k_min: int, k_max: int, adaptive: bool = True) -> None:
        self.k_min, self.k_max, self.adaptive = k_min, k_max, adaptive
        self.costs = StepCostModel()

    @staticmethod
    def updated_rate(rate: float | None, num_drafted: int, num_accepted: int) -> float:
        """A request's acceptance rate after one verification: drafts compared before the
        first rejection are trials, accepted ones successes."""
        trials = num_accepted + (1 if num_accepted < num_drafted else 0)
        if trials == 0:
            return ACCEPT_PRIOR if rate is None else rate
        seen = num_accepted / trials
        return seen if rate is None else (1 - ACCEPT_EMA) * rate + ACCEPT_EMA * seen

    def choose(
        self, rates: list[float | None], num_tokens: int, num_outputs: int, budget: int
    ) -> list[int]:
        """K for each candidate request (its acceptance rate, None if unknown) given the step's
        `num_tokens` without drafts, the `num_outputs` tokens it samples without drafts, and at
        most `budget` draft tokens in all."""
        ks = [self.k_min] * len(rates)
        budget -= sum(ks)
        if not self.adaptive:
            return [min(self.k_max, self.k_min + max(0, budget) // max(1, len(rates)))] * len(rates)
        coef = self.costs.coefficients()
        if coef is None:  # nothing measured yet: draft fully once to learn the costs
            return [self.k_max] * len(rates) if budget >= self.k_max * len(rates) else ks
        c0, c1 = coef
        p = [ACCEPT_PRIOR if a is None else min(a, 0.99) for a in rates]
        gain = float(num_outputs)  # expected tokens out of the step
        time = c0 + c1 * (num_tokens + sum(ks))
        if max(p, default=0.0) * time <= c1 * gain:  # not even the best draft pays
            return ks
        heap = [(-(p[i] ** (ks[i] + 1)), i) for i in range(len(p)) if ks[i] < self.k_max]
        heapq.heapify(heap)
        while heap and budget > 0:
            neg, i = heapq.heappop(heap)
            if -neg * time <= c1 * gain:  # the best remaining draft lowers tokens per second
                break
            ks[i] += 1
            gain -= neg
            time += c1
            budget -= 1
            if ks[i] < self.k_max:
                heapq.heappush(heap, (-(p[i] ** (ks[i] + 1)), i))
        return ks
