"""The one-sided sign test: is a rank above its peers' median in more steps than chance allows?

With no excess, a rank's value is as often above its peers' median as below it: the number of its steps with a
positive excess is Binomial(n, 1/2). The tail P(X ≥ k) is the test's p-value (``own_sign_p``); the own-work test
(:mod:`.own_work`) compares it with the rule's confidence, split over the ranks (Bonferroni). Unlike the bound on the
mean, one step a rank spent held off the CPU does not widen it.
"""

from __future__ import annotations

import math

__all__ = ["_binomial_half_tail"]


def _binomial_half_tail(k: int, n: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, 1/2) (exact up to 400 steps, then the normal limit with continuity correction)."""
    if n <= 0 or k <= 0:
        return 1.0
    if n > 400:
        return 0.5 * math.erfc((k - 0.5 - n / 2) / math.sqrt(n / 4) / math.sqrt(2))
    return math.fsum(math.comb(n, j) for j in range(k, n + 1)) / 2.0 ** n
