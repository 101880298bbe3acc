"""Plan -> local processes: workers planned beyond the spec's count, GPUs per process, capacity and
port checks, and the embedded default deployment."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from omni_operator.api.load import load_deployments, parse_deployments
from omni_operator.api.runtime_env import OPERATOR_ENV
from omni_operator.api.spec import OmniDeployment
from omni_operator.local.default import DEFAULT_DEPLOYMENT_YAML
from omni_operator.local.processes import (
    LocalCapacityError,
    LocalSettings,
    busy_ports,
    check_capacity,
    check_checkpoint,
    check_ports,
    host_gpus,
    plan_local,
    plan_worker,
    process_specs,
    router_spec,
    worker_processes,
)
from omni_operator.plan.layout import process_model_path
from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.types import Target

SETTINGS = LocalSettings(base_port=9100, router_port=9000, gpu_offset=0, workers_file="/state/workers.json")
PY = (sys.executable, "-m", "omni_operator.cli")
EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


def dep(**spec: object) -> OmniDeployment:
    body = {"model": {"name": "m", "source": {"type": "tiny"}, "architecture": "qwen2_5_omni"}, **spec}
    return OmniDeployment.model_validate({"metadata": {"name": "d"}, "spec": body})


def test_default_deployment_is_two_tiny_cpu_workers() -> None:
    (default,) = parse_deployments(DEFAULT_DEPLOYMENT_YAML)
    plan = plan_local(default, SETTINGS)
    assert [w.name for w in plan.workers] == ["tiny-omni-w0", "tiny-omni-w1"]
    assert plan.gpus_per_worker == 0
    assert plan.workers[0].pods[0].container.command[:2] == ("omni", "serve")


def test_plan_worker_beyond_the_count_matches_a_larger_spec() -> None:
    small = dep(workers=2, gpu={"tier": "cpu"})
    worker = plan_worker(small, SETTINGS, index=5)
    larger = plan_local(dep(workers=6, gpu={"tier": "cpu"}), SETTINGS).workers[5]
    assert worker == larger
    assert worker.name == "d-w5"
    assert worker.api_url == "http://127.0.0.1:9151"
    assert worker.revision == plan_local(small, SETTINGS).revision


def test_cpu_worker_process() -> None:
    worker = plan_worker(dep(gpu={"tier": "cpu"}, pipeline="text"), SETTINGS, index=0)
    (proc,) = worker_processes(worker, base_env={"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert proc.name == "d-w0/worker"
    assert proc.worker == "d-w0"
    assert proc.argv == (
        *PY,
        "serve",
        "--model-name",
        "m",
        "--pipeline",
        "text",
        "--host",
        "127.0.0.1",
        "--port",
        "9101",
        "--device",
        "cpu",
        "--worker-id",
        "d-w0",
        "--revision",
        worker.revision,
    )
    # A CPU process never inherits the caller's GPUs.
    assert proc.env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": ""}


def test_gpu_worker_processes_get_the_host_gpus_they_were_given() -> None:
    spec = dep(gpu={"tier": "h100"}, stages={"thinker": {"tensorParallelSize": 2}})
    worker = plan_worker(spec, SETTINGS, index=3)
    procs = worker_processes(worker, gpus=(4, 5, 7), base_env={})
    assert [(p.name, p.env["CUDA_VISIBLE_DEVICES"]) for p in procs] == [
        ("d-w3/thinker", "4,5"),
        ("d-w3/talker", "7"),
        ("d-w3/api", ""),
    ]
    with pytest.raises(LocalCapacityError, match="d-w3 needs 3 GPUs, 2 given"):
        worker_processes(worker, gpus=(0, 1), base_env={})


def test_process_specs_lay_workers_on_consecutive_gpus() -> None:
    plan = plan_local(dep(workers=2, gpu={"tier": "h100"}), SETTINGS)
    assert [(p.name, p.env["CUDA_VISIBLE_DEVICES"]) for p in process_specs(plan=plan, base_env={})] == [
        ("d-w0/thinker", "0"),
        ("d-w0/talker", "1"),
        ("d-w0/api", ""),
        ("d-w1/thinker", "2"),
        ("d-w1/talker", "3"),
        ("d-w1/api", ""),
    ]


def test_router_spec() -> None:
    plan = plan_local(dep(gpu={"tier": "cpu"}), SETTINGS)
    spec = router_spec(plan=plan, base_env={"CUDA_VISIBLE_DEVICES": "3"})
    assert spec.name == "router"
    assert spec.worker is None
    assert spec.argv[: len(PY) + 7] == (
        *PY,
        "router",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--workers-file",
        "/state/workers.json",
    )
    assert spec.env == {"CUDA_VISIBLE_DEVICES": ""}


def test_spec_env_reaches_every_worker_process_over_the_inherited_one_and_not_the_router() -> None:
    spec = dep(
        workers=2,
        gpu={"tier": "h100"},
        runtime={"env": {"OMNI_BUSY_STREAMS": "8", "OMNI_SUFFIX_GRAPHS": "1"}},
    )
    plan = plan_local(spec, SETTINGS)
    base = {"PATH": "/bin", "OMNI_BUSY_STREAMS": "2"}
    assert [(p.name, p.env) for p in process_specs(plan=plan, base_env=base)] == [
        (
            f"d-w{i}/{role}",
            {
                "PATH": "/bin",
                "OMNI_BUSY_STREAMS": "8",
                "OMNI_SUFFIX_GRAPHS": "1",
                "CUDA_VISIBLE_DEVICES": gpus,
            },
        )
        for i in range(2)
        for role, gpus in (("thinker", str(2 * i)), ("talker", str(2 * i + 1)), ("api", ""))
    ]
    assert router_spec(plan=plan, base_env=base).env == {**base, "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_name_local_mode_sets_is_refused_in_the_spec(
    path: Path, local_checkpoint: Callable[[OmniDeployment], OmniDeployment]
) -> None:
    (example,) = load_deployments(path)
    plan = plan_local(local_checkpoint(example), SETTINGS)
    written = {name for spec in process_specs(plan=plan, base_env={}) for name in spec.env}
    assert written <= OPERATOR_ENV.keys()


def test_capacity_message_names_the_field_and_the_fix() -> None:
    plan = plan_local(dep(workers=3, gpu={"tier": "h100"}), SETTINGS)
    check_capacity(plan=plan, available_gpus=6)
    with pytest.raises(LocalCapacityError) as err:
        check_capacity(plan=plan, available_gpus=8, gpu_offset=4)
    assert str(err.value) == (
        "spec.workers: 3 workers x 2 GPUs after --gpu-offset 4 need 10 GPUs, this machine has 8; "
        "lower spec.workers, or use gpu.tier: cpu for a CPU run"
    )
    check_capacity(plan=plan_local(dep(workers=64, gpu={"tier": "cpu"}), SETTINGS), available_gpus=0)


def test_host_gpus() -> None:
    assert host_gpus(available_gpus=4, gpu_offset=1) == [1, 2, 3]
    assert host_gpus(available_gpus=0, gpu_offset=0) == []
    assert host_gpus(available_gpus=2, gpu_offset=5) == []


def test_busy_ports_and_check_ports() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert busy_ports([port]) == [port]
        settings = LocalSettings(base_port=port - 1, router_port=1, gpu_offset=0, workers_file="/w.json")
        plan = plan_local(dep(workers=1, gpu={"tier": "cpu"}), settings)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            router_port = free.getsockname()[1]
        plan = plan.model_copy(update={"router": plan.router.model_copy(update={"port": router_port})})
        with pytest.raises(LocalCapacityError, match=rf"--base-port: port {port} of d-w0 is in use"):
            check_ports(plan=plan)
        busy_router = plan.model_copy(update={"router": plan.router.model_copy(update={"port": port})})
        with pytest.raises(LocalCapacityError, match=rf"--port {port}: another process listens there"):
            check_ports(plan=busy_router)


def test_readiness_url_follows_the_runtime() -> None:
    from omni_operator.local.workers import LocalWorker

    builtin = LocalWorker(plan=plan_worker(dep(gpu={"tier": "cpu"}), SETTINGS, index=1), processes=[])
    assert builtin.ready_url == "http://127.0.0.1:9111/ready"
    sglang = OmniDeployment.model_validate(
        {
            "metadata": {"name": "d"},
            "spec": {
                "model": {"name": "Qwen/Qwen3-Omni-30B-A3B-Instruct"},
                "runtime": {"type": "sglang-omni"},
            },
        }
    )
    third_party = LocalWorker(plan=plan_worker(sglang, SETTINGS, index=0), processes=[])
    assert third_party.ready_url == "http://127.0.0.1:9101/health"


HOST_DIR = "/data/checkpoints/qwen"
SOURCES = {
    "tiny": {"type": "tiny"},
    "image": {"type": "image"},
    "hostPath": {"type": "hostPath", "hostPath": HOST_DIR},
    "pvc": {"type": "pvc", "claimName": "models"},
}


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("image", Target.local, "/models/qwen"),
        ("image", Target.kubernetes, "/models/qwen"),
        ("hostPath", Target.local, HOST_DIR),  # the node is this machine: the directory itself
        ("hostPath", Target.kubernetes, "/models/qwen"),  # mounted at model.path in the pods
        ("pvc", Target.kubernetes, "/models/qwen"),
    ],
)
def test_where_the_processes_read_the_checkpoint(source: str, target: Target, expected: str) -> None:
    """Each runtime's command carries the checkpoint directory the processes see
    (layout.process_model_path): the builtin worker, sglang-omni's --model-path and vllm-omni's
    positional model, locally and in pods."""
    model = {"name": "m", "path": "/models/qwen", "source": SOURCES[source], "architecture": "qwen3_omni"}
    spec = {"model": model, "gpu": {"tier": "h200"}, "pipeline": "text"}
    assert process_model_path(OmniDeployment.model_validate({"metadata": {"name": "d"}, "spec": spec}).spec,
                              local=target is Target.local) == expected  # fmt: skip
    for runtime in ("builtin", "sglang-omni", "vllm-omni"):
        body = {"metadata": {"name": "d"}, "spec": {**spec, "runtime": {"type": runtime}}}
        plan = plan_deployment(OmniDeployment.model_validate(body), target=target, workers_file="/w.json")
        commands = [pod.container.command for pod in plan.workers[0].pods]
        paths = [c[c.index("--model-path") + 1] for c in commands if "--model-path" in c]
        if runtime == "vllm-omni":
            paths = [c[c.index("serve") + 1] for c in commands]
        assert paths and set(paths) == {expected}, (runtime, commands)


@pytest.mark.parametrize(
    ("source", "path", "config", "expected"),
    [
        ("tiny", "missing", False, None),  # the runtime writes the tiny checkpoint itself
        ("hostPath", "dir", True, None),
        ("image", "dir", True, None),
        ("hostPath", "dir", False, "spec.model.source.hostPath: {dir} has no config.json; point it at the checkpoint"),
        ("hostPath", "missing", False, "spec.model.source.hostPath: {missing} is not a directory on this machine"),
        ("image", "missing", False, "spec.model.path: {missing} is not a directory on this machine; with source type "
         "image omni up reads the checkpoint there on this machine: set spec.model.path to the checkpoint "
         "directory, or use source type hostPath with hostPath set to it"),
    ],
)  # fmt: skip
def test_check_checkpoint_table(
    tmp_path: Path, source: str, path: str, config: bool, expected: str | None
) -> None:
    places = {"dir": tmp_path / "ckpt", "missing": tmp_path / "nothing"}
    places["dir"].mkdir()
    if config:
        (places["dir"] / "config.json").write_text("{}")
    where = str(places[path])
    src = {**SOURCES[source], **({"hostPath": where} if source == "hostPath" else {})}
    model = {"name": "m", "path": where, "source": src, "architecture": "qwen2_5_omni"}
    spec = OmniDeployment.model_validate({"metadata": {"name": "d"}, "spec": {"model": model}}).spec
    if expected is None:
        check_checkpoint(spec)
        return
    with pytest.raises(LocalCapacityError) as err:
        check_checkpoint(spec)
    assert str(err.value).startswith(expected.format(dir=places["dir"], missing=places["missing"]))
