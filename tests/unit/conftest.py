"""What unit tests in several directories share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from omni_operator.api.spec import ModelSource, OmniDeployment, SourceType


def on_this_machine(dep: OmniDeployment) -> OmniDeployment:
    """``dep`` as `omni up` would run it: its checkpoint read from ``model.path`` on this machine
    (a hostPath source) where it names a PersistentVolumeClaim, which only a cluster has."""
    if dep.spec.model.source.type is not SourceType.pvc:
        return dep
    local = ModelSource(type=SourceType.host_path, host_path=dep.spec.model.path)
    model = dep.spec.model.model_copy(update={"source": local})
    return dep.model_copy(update={"spec": dep.spec.model_copy(update={"model": model})})


@pytest.fixture
def local_checkpoint() -> Callable[[OmniDeployment], OmniDeployment]:
    """``on_this_machine``: a cluster example planned for `omni up` (plans refuse a pvc source there)."""
    return on_this_machine
