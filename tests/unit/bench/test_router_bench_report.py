"""Router bench report: the router's own p99 from two scrapes of its overhead histogram."""

from __future__ import annotations

import math

import pytest

from omni_runtime.bench.router.report import histogram_quantile

BEFORE = {0.0005: 10.0, 0.001: 10.0, 0.002: 12.0, math.inf: 12.0}


@pytest.mark.parametrize(
    ("after", "q", "expected"),
    [
        # 100 new observations: 90 under 0.5 ms, 9 in (0.5, 1] ms, 1 in (1, 2] ms.
        ({0.0005: 100.0, 0.001: 109.0, 0.002: 112.0, math.inf: 112.0}, 0.99, 0.001),
        ({0.0005: 100.0, 0.001: 109.0, 0.002: 112.0, math.inf: 112.0}, 0.5, 0.0005),
        ({0.0005: 100.0, 0.001: 109.0, 0.002: 112.0, math.inf: 112.0}, 1.0, 0.002),
        # Observations past the last finite bucket land in +Inf.
        ({0.0005: 10.0, 0.001: 10.0, 0.002: 12.0, math.inf: 22.0}, 0.99, math.inf),
        # Nothing observed between the scrapes.
        (BEFORE, 0.99, 0.0),
    ],
)
def test_quantile_of_the_observations_between_two_scrapes(after, q, expected) -> None:
    assert histogram_quantile(after, BEFORE, q) == expected


def test_first_scrape_may_be_empty() -> None:
    assert histogram_quantile({0.001: 3.0, math.inf: 4.0}, {}, 0.5) == 0.001
