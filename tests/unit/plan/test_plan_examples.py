"""The plan of every example equals an exact expected plan (full Plans for two, key fields for all)."""

from __future__ import annotations

import pytest
from spec_builders import example

from omni_operator.plan import plan_deployment, pod_revision, worker_revision
from omni_operator.plan.adapters import VLLM_PRELUDE
from omni_operator.plan.types import (
    Container,
    ModelVolume,
    Plan,
    Role,
    RouterPlan,
    Scheduling,
    Stage,
    StagePod,
    Target,
    WorkerPlan,
)

S = Stage
SPEECH_STAGES = (
    S.preprocessing,
    S.audio_encoder,
    S.image_encoder,
    S.mm_aggregate,
    S.thinker,
    S.decode,
    S.talker,
)
SPEECH_EDGES = (
    (S.preprocessing, S.audio_encoder),
    (S.preprocessing, S.image_encoder),
    (S.preprocessing, S.mm_aggregate),
    (S.audio_encoder, S.mm_aggregate),
    (S.image_encoder, S.mm_aggregate),
    (S.mm_aggregate, S.thinker),
    (S.thinker, S.decode),
    (S.thinker, S.talker),
)
ROUTER_IMAGE = "ghcr.io/omni-dev/omni-runtime:0.1.0"
TINY_IMAGE = "ghcr.io/omni-dev/omni-runtime:0.1.0-cpu"  # what `make images` builds


def _router(deployment: str, *, image: str = ROUTER_IMAGE, cpu: str = "1", memory: str = "1Gi") -> RouterPlan:
    command = (
        "omni", "router", "--host", "0.0.0.0", "--port", "8000", "--source", "kubernetes", "--namespace", "default",
        "--deployment", deployment, "--session-header", "X-Session-Id", "--max-sessions-per-worker", "256",
        "--max-body-bytes", "67108864", "--upstream-timeout", "600",
    )  # fmt: skip
    return RouterPlan(
        replicas=1,
        port=8000,
        session_header="X-Session-Id",
        service_type="ClusterIP",
        container=Container(
            image=image,
            command=command,
            ports={"http": 8000},
            cpu=cpu,
            memory=memory,
            readiness_path="/health",
            liveness_path="/health",
        ),
    )


def _with_pod_revisions(worker: WorkerPlan) -> WorkerPlan:
    pods = tuple(
        p.model_copy(update={"revision": pod_revision(p, worker=worker.name, revision=worker.revision)})
        for p in worker.pods
    )
    return worker.model_copy(update={"pods": pods})


def test_tiny_cpu_full_plan() -> None:
    dep = example("tiny-cpu.yaml")
    rev = worker_revision(dep.spec)

    def worker(i: int) -> WorkerPlan:
        name = f"tiny-omni-w{i}"
        command = (
            "omni", "serve", "--model-name", "tiny-omni", "--pipeline", "speech", "--port", "8000",
            "--device", "cpu", "--worker-id", name, "--revision", rev,
        )  # fmt: skip
        pod = StagePod(
            role=Role.worker,
            name=f"{name}-worker",
            hostname="worker",
            stages=SPEECH_STAGES,
            address=f"worker.{name}.default.svc.cluster.local:8000",
            revision="",
            container=Container(
                image=TINY_IMAGE,
                command=command,
                ports={"http": 8000},
                cpu="500m",
                memory="3Gi",
                readiness_path="/ready",
                liveness_path="/health",
            ),
        )
        return _with_pod_revisions(
            WorkerPlan(
                index=i,
                name=name,
                revision=rev,
                api_url=f"http://worker.{name}.default.svc.cluster.local:8000",
                gpus=0,
                pods=(pod,),
            )
        )

    expected = Plan(
        deployment="tiny-omni",
        namespace="default",
        target=Target.kubernetes,
        model_name="tiny-omni",
        architecture="auto",
        runtime="builtin",
        pipeline="speech",
        stages=SPEECH_STAGES,
        edges=SPEECH_EDGES,
        gpu_tier="cpu",
        gpu_memory_gb=0.0,
        mem_fraction_static=0.8,
        gpus_per_worker=0,
        revision=rev,
        workers=(worker(0), worker(1)),
        router=_router("tiny-omni", image=TINY_IMAGE, cpu="200m", memory="512Mi"),
        scheduling=Scheduling(),
        model_volume=ModelVolume(source="tiny", mount_path="/models/model"),
    )
    assert plan_deployment(dep) == expected


def test_ming_speech_full_plan() -> None:
    dep = example("ming-flash-omni-speech-h100.yaml")
    rev = worker_revision(dep.spec)
    command = (
        "sgl-omni", "serve", "--model-path", "/models/Ming-flash-omni-2.0", "--model-name", "Ming-flash-omni-2.0",
        "--host", "0.0.0.0", "--port", "8000", "--variant", "speech", "--thinker.tp_size", "4",
        "--thinker.gpu", "[0,1,2,3]", "--talker.gpu", "4", "--thinker.engine.mem_fraction_static", "0.8",
    )  # fmt: skip
    pod = StagePod(
        role=Role.worker,
        name="ming-speech-w0-worker",
        hostname="worker",
        stages=SPEECH_STAGES,
        logical_gpus=(0, 1, 2, 3, 4),
        address="worker.ming-speech-w0.default.svc.cluster.local:8000",
        revision="",
        container=Container(
            image="lmsysorg/sglang-omni:latest",
            command=command,
            ports={"http": 8000},
            # From the catalogue: 4 + 4 x 5 GPUs; 207 GB bf16 checkpoint + 16 + 8 x 5 GB;
            # 30 minutes + 6 s per checkpoint GB.
            cpu="24",
            memory="263Gi",
            gpus=5,
            readiness_path="/health",
            liveness_path="/health",
            startup_s=3042,
            probe_timeout_s=5,
        ),
    )
    worker = _with_pod_revisions(
        WorkerPlan(
            index=0,
            name="ming-speech-w0",
            revision=rev,
            api_url="http://worker.ming-speech-w0.default.svc.cluster.local:8000",
            gpus=5,
            pods=(pod,),
        )
    )
    expected = Plan(
        deployment="ming-speech",
        namespace="default",
        target=Target.kubernetes,
        model_name="Ming-flash-omni-2.0",
        architecture="ming_omni",
        runtime="sglang-omni",
        runtime_version="0.1.9",
        pipeline="speech",
        stages=SPEECH_STAGES,
        edges=SPEECH_EDGES,
        gpu_tier="h100",
        gpu_memory_gb=80.0,
        mem_fraction_static=0.8,
        gpus_per_worker=5,
        revision=rev,
        workers=(worker,),
        router=_router("ming-speech"),
        scheduling=Scheduling(),
        model_volume=ModelVolume(
            source="pvc", mount_path="/models/Ming-flash-omni-2.0", claim_name="ming-flash-omni-2-0"
        ),
    )
    assert plan_deployment(dep) == expected


MING = (
    "--model-path",
    "/models/Ming-flash-omni-2.0",
    "--model-name",
    "Ming-flash-omni-2.0",
    "--host",
    "0.0.0.0",
)
QWEN25 = (
    "--model-path",
    "/models/Qwen2.5-Omni-7B",
    "--model-name",
    "Qwen2.5-Omni-7B",
    "--pipeline",
    "speech",
)
QWEN3 = (
    "--model-path",
    "/models/Qwen3-Omni-30B-A3B-Instruct",
    "--model-name",
    "Qwen3-Omni-30B-A3B-Instruct",
    "--pipeline",
    "streaming-speech",
)
QWEN3_DUPLEX = (*QWEN3[:-1], "duplex")
MINICPM = ("--model-path", "/models/MiniCPM-o-4_5", "--model-name", "MiniCPM-o-4_5", "--pipeline", "duplex")


def _thinker_addr(worker: str, port: int = 9100) -> str:
    return f"thinker.{worker}.default.svc.cluster.local:{port}"


def _builtin_split(worker: str, flags: tuple[str, ...], *, mem: str, streaming: bool = False) -> list:
    """The builtin runtime's split layout of one worker: api pod (CPU), thinker GPU 0, talker GPU 1."""
    thinker, talker = _thinker_addr(worker), f"talker.{worker}.default.svc.cluster.local:9101"
    talker_stages = (S.talker, S.talker_stream) if streaming else (S.talker,)
    api_stages = (S.preprocessing, S.decode, S.segmenter) if streaming else (S.preprocessing, S.decode)
    remote = [
        ("--remote-stage", f"{stage}={thinker}")
        for stage in ("audio_encoder", "image_encoder", "mm_aggregate", "thinker")
    ]
    return [
        (f"{worker}-api", Role.api, api_stages, (),
         ("omni", "serve", *flags, "--port", "8000", "--device", "cpu", "--worker-id", worker, "--revision", "{rev}",
          *(arg for pair in remote for arg in pair), "--remote-stage", f"talker={talker}")),
        (f"{worker}-thinker", Role.thinker, (S.audio_encoder, S.image_encoder, S.mm_aggregate, S.thinker), (0,),
         ("omni", "stage", "--stages", "audio_encoder,image_encoder,mm_aggregate,thinker", *flags,
          "--port", "9100", "--device", "cuda", "--thinker-tp-size", "1", "--thinker-gpus", "0",
          "--image-encoder-tp-size", "1", "--image-encoder-gpus", "0", "--mem-fraction-static", mem,
          "--worker-id", worker, "--revision", "{rev}")),
        (f"{worker}-talker", Role.talker, talker_stages, (1,),
         ("omni", "stage", "--stages", ",".join(s.value for s in talker_stages), *flags, "--port", "9101",
          "--device", "cuda", "--talker-gpu", "0", "--worker-id", worker, "--revision", "{rev}")),
    ]  # fmt: skip


# (example, architecture, gpus per worker, mem fraction, [(pod name, role, stages, logical GPUs, command)])
# Commands use {rev} for the worker revision.
EXAMPLE_TABLE = [
    (
        "ming-flash-omni-text-h100.yaml",
        "ming_omni",
        4,
        0.8,
        [
            (
                "ming-text-w0-worker",
                Role.worker,
                (S.preprocessing, S.audio_encoder, S.image_encoder, S.mm_aggregate, S.thinker, S.decode),
                (0, 1, 2, 3),
                ("sgl-omni", "serve", *MING, "--port", "8000", "--variant", "text", "--thinker.tp_size", "4",
                 "--thinker.gpu", "[0,1,2,3]", "--thinker.engine.mem_fraction_static", "0.8"),
            )
        ],
    ),
    (
        "ming-flash-omni-vision-tp2-h200.yaml",
        "ming_omni",
        5,
        0.9,
        [
            (
                "ming-vision-w0-worker",
                Role.worker,
                SPEECH_STAGES,
                (0, 1, 2, 3, 4),
                ("sgl-omni", "serve", *MING, "--port", "8000", "--variant", "speech", "--thinker.tp_size", "2",
                 "--thinker.gpu", "[0,1]", "--talker.gpu", "2", "--image_encoder.tp_size", "2",
                 "--image_encoder.gpu", "[3,4]", "--thinker.engine.mem_fraction_static", "0.9"),
            )
        ],
    ),
    (
        "qwen3-omni-vllm.yaml",
        "qwen3_omni",
        3,
        0.8,
        [
            (
                f"qwen3-omni-w{i}-worker",
                Role.worker,
                SPEECH_STAGES,
                (0, 1, 2),
                ("sh", "-c", VLLM_PRELUDE, "vllm-omni", "serve", "/models/Qwen3-Omni-30B-A3B-Instruct", "--omni",
                 "--port", "8000", "--served-model-name", "Qwen3-Omni-30B-A3B-Instruct",
                 "--deploy-config", "/etc/omni/deploy_config.yaml"),
            )
            for i in range(2)
        ],
    ),
    ("qwen2.5-omni-7b-h100.yaml", "qwen2_5_omni", 2, 0.8, _builtin_split("qwen25-omni-w0", QWEN25, mem="0.8")),
    (
        "qwen3-omni-builtin-h200.yaml",
        "qwen3_omni",
        2,
        0.9,
        _builtin_split("qwen3-omni-builtin-w0", QWEN3, mem="0.9", streaming=True),
    ),
    (
        "qwen3-omni-builtin-duplex-h200.yaml",
        "qwen3_omni",
        2,
        0.9,
        [
            pod
            for i in range(2)
            for pod in _builtin_split(f"qwen3-omni-builtin-duplex-w{i}", QWEN3_DUPLEX, mem="0.9", streaming=True)
        ],
    ),
    (
        "tiny-qwen3-cpu.yaml",
        "qwen3_omni",
        0,
        0.8,
        [
            (
                "tiny-qwen3-w0-worker",
                Role.worker,
                (*SPEECH_STAGES, S.segmenter, S.talker_stream),
                (),
                # No --model-path: the runtime writes the family's tiny checkpoint (--tiny-family).
                ("omni", "serve", "--tiny-family", "qwen3_omni_moe", "--model-name", "tiny-qwen3-omni",
                 "--pipeline", "streaming-speech", "--port", "8000", "--device", "cpu",
                 "--worker-id", "tiny-qwen3-w0", "--revision", "{rev}"),
            ),
        ],
    ),
    ("minicpm-o-duplex.yaml", "minicpm_o", 2, 0.8,
     _builtin_split("minicpm-duplex-w0", MINICPM, mem="0.8", streaming=True)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "architecture", "gpus", "mem_fraction", "pods"), EXAMPLE_TABLE)
def test_example_plan(name: str, architecture: str, gpus: int, mem_fraction: float, pods: list) -> None:
    dep = example(name)
    plan = plan_deployment(dep)
    rev = worker_revision(dep.spec)
    assert plan.architecture == architecture
    assert plan.gpus_per_worker == gpus
    assert plan.mem_fraction_static == mem_fraction
    got = [
        (p.name, p.role, p.stages, p.logical_gpus, p.container.command) for w in plan.workers for p in w.pods
    ]
    want = [(n, r, s, g, tuple(a.replace("{rev}", rev) for a in c)) for n, r, s, g, c in pods]
    assert got == want
    assert sum(p.container.gpus for p in plan.workers[0].pods) == gpus


def test_builtin_gpu_pods_request_their_own_gpus_only() -> None:
    plan = plan_deployment(example("qwen2.5-omni-7b-h100.yaml"))
    pods = {p.role: p for p in plan.workers[0].pods}
    assert {r: p.container.gpus for r, p in pods.items()} == {Role.api: 0, Role.thinker: 1, Role.talker: 1}
    assert {r: (p.container.cpu, p.container.memory) for r, p in pods.items()} == {
        Role.api: ("2", "4Gi"),
        Role.thinker: ("8", "64Gi"),
        Role.talker: (None, None),
    }
    assert plan.workers[0].api_url == "http://api.qwen25-omni-w0.default.svc.cluster.local:8000"
    assert {r: p.container.ports for r, p in pods.items()} == {
        Role.api: {"http": 8000},
        Role.thinker: {"thinker": 9100},
        Role.talker: {"talker": 9101},
    }


def test_vllm_deploy_config_layers_on_the_shipped_file_and_places_thinker_then_talker() -> None:
    plan = plan_deployment(example("qwen3-omni-vllm.yaml"))
    import yaml

    config = yaml.safe_load(plan.config_files["deploy_config.yaml"])
    assert config == {
        "base_config": "${oc.env:OMNI_VLLM_OMNI_DEPLOY_DIR}/qwen3_omni_moe.yaml",
        "trust_remote_code": True,
        "stages": [
            {"stage_id": 0, "devices": "0,1", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8},
            {"stage_id": 1, "devices": "2"},
            {"stage_id": 2, "devices": "2"},
        ],
    }
    assert plan.runtime_version == "0.30.0"
    assert plan.router.replicas == 2


def test_mixed_tolerations_and_selector_reach_scheduling() -> None:
    plan = plan_deployment(example("qwen2.5-omni-7b-h100.yaml"))
    assert plan.scheduling.tolerations == (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )
    minicpm = plan_deployment(example("minicpm-o-duplex.yaml"))
    assert minicpm.scheduling.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert minicpm.gpu_memory_gb == 48.0
    assert plan.model_volume == ModelVolume(
        source="hostPath", mount_path="/models/Qwen2.5-Omni-7B", host_path="/mnt/models/Qwen2.5-Omni-7B"
    )


@pytest.mark.parametrize(
    ("name", "duplex"),
    [("qwen3-omni-builtin-duplex-h200.yaml", True), ("qwen3-omni-builtin-h200.yaml", False)],
)
def test_a_duplex_worker_makes_its_realtime_sessions_duplex(name: str, duplex: bool) -> None:
    """The api pod's `omni serve --pipeline duplex` turns on full duplex for /v1/realtime sessions."""
    from omni_runtime.entrypoints.serve import build_parser
    from omni_runtime.entrypoints.streaming_input_flags import realtime_settings
    from omni_runtime.media.limits import MediaLimits

    api = next(p for p in plan_deployment(example(name)).workers[0].pods if p.role is Role.api)
    command = api.container.command
    assert command[:2] == ("omni", "serve")
    args = build_parser().parse_args(list(command[2:]))
    assert realtime_settings(args, limits=MediaLimits()).duplex_by_default is duplex
