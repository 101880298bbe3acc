"""Fixtures for `omni up` component tests; the harness itself lives in up_harness.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from up_harness import OmniUp, free_base_port, free_port


@pytest.fixture
def make_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], OmniUp]]:
    made: list[OmniUp] = []

    def make() -> OmniUp:
        # A short state dir: the control socket path must fit in sun_path.
        up = OmniUp(
            state_dir=tmp_path_factory.mktemp("up"), router_port=free_port(), base_port=free_base_port()
        )
        made.append(up)
        return up

    yield make
    for up in made:
        up.cleanup()
