"""spec.sessionKv in the plan: `--session-kv-mb` on the process that runs the thinker (the thinker
stage pod on GPUs, `omni serve` on the CPU tier), nothing when unset (the runtime's default: off),
and a clear error for a peer runtime, whose servers keep no session KV."""

from __future__ import annotations

import pydantic
import pytest
from spec_builders import deployment, flag

from omni_operator.plan import plan_deployment, worker_revision
from omni_operator.plan.types import PlanError, Role


@pytest.mark.parametrize(
    ("value", "flags"), [(None, []), (0, ["--session-kv-mb", "0"]), (1024, ["--session-kv-mb", "1024"])]
)
def test_session_kv_goes_to_the_process_that_runs_the_thinker(value: int | None, flags: list[str]) -> None:
    extra = {} if value is None else {"sessionKv.maxMib": value}
    plan = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", **extra}))
    pods = {p.role: p for p in plan.workers[0].pods}
    assert pods[Role.thinker].container.command[:2] == ("omni", "stage")
    assert flag(pods[Role.thinker].container.command, "--session-kv-mb") == flags
    for role in (Role.api, Role.talker):  # the thinker runs elsewhere: they keep nothing
        assert flag(pods[role].container.command, "--session-kv-mb") == []
    cpu = plan_deployment(deployment(**{"gpu.tier": "cpu", **extra}))
    (pod,) = cpu.workers[0].pods
    assert (
        pod.container.command[:2] == ("omni", "serve")
        and flag(pod.container.command, "--session-kv-mb") == flags
    )


def test_negative_size_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"sessionKv\.maxMib|session_kv\.max_mib"):
        deployment(**{"sessionKv.maxMib": -1})


@pytest.mark.parametrize("runtime", ["vllm-omni", "sglang-omni"])
def test_a_peer_runtime_with_session_kv_is_refused_with_the_fix(runtime: str) -> None:
    spec = deployment(
        **{
            "model.name": "Qwen3-Omni-30B-A3B-Instruct",
            "model.architecture": "qwen3_omni",
            "runtime.type": runtime,
            "sessionKv.maxMib": 512,
        }
    )
    with pytest.raises(PlanError) as err:
        plan_deployment(spec)
    assert str(err.value) == (
        "spec.sessionKv.maxMib: only the builtin runtime keeps a session's KV between turns; "
        "remove sessionKv.maxMib, or use runtime.type: builtin"
    )


def test_worker_revision_moves_only_when_session_kv_is_set() -> None:
    base = deployment(**{"model.name": "Qwen2.5-Omni-7B"})
    kept = deployment(**{"model.name": "Qwen2.5-Omni-7B", "sessionKv.maxMib": 1024})
    other = deployment(**{"model.name": "Qwen2.5-Omni-7B", "sessionKv.maxMib": 0})
    # Unset, the revision is the one from before spec.sessionKv existed: test_plan_media pins that hash.
    assert len({worker_revision(d.spec) for d in (base, kept, other)}) == 3
