"""Layouts beyond the examples: local target, multi-node thinkers, variants, revisions."""

from __future__ import annotations

from collections.abc import Callable

from spec_builders import deployment, example

from omni_operator.api.spec import OmniDeployment
from omni_operator.plan import Role, Stage, Target, plan_deployment, worker_revision
from omni_operator.plan.graph import pipeline_edges

S = Stage


def test_local_tiny_ports_and_router() -> None:
    plan = plan_deployment(example("tiny-cpu.yaml"), target=Target.local, base_port=8100, router_port=9000)
    rev = plan.revision
    assert [w.api_url for w in plan.workers] == ["http://127.0.0.1:8101", "http://127.0.0.1:8111"]
    assert plan.workers[1].pods[0].container.command == (
        "omni", "serve", "--model-name", "tiny-omni", "--pipeline", "speech", "--host", "127.0.0.1",
        "--port", "8111", "--device", "cpu", "--worker-id", "tiny-omni-w1", "--revision", rev,
    )  # fmt: skip
    assert plan.router.port == 9000
    assert plan.router.container.command == (
        "omni", "router", "--host", "127.0.0.1", "--port", "9000", "--workers-file", ".omni/tiny-omni/workers.json",
        "--session-header", "X-Session-Id", "--max-sessions-per-worker", "256",
        "--max-body-bytes", "67108864", "--upstream-timeout", "600",
    )  # fmt: skip


def test_local_gpu_workers_get_host_gpus_after_the_offset(
    local_checkpoint: Callable[[OmniDeployment], OmniDeployment],
) -> None:
    dep = local_checkpoint(example("minicpm-o-duplex.yaml"))
    dep = dep.model_copy(update={"spec": dep.spec.model_copy(update={"workers": 2})})
    plan = plan_deployment(dep, target=Target.local, gpu_offset=2, base_port=7000, workers_file="/run/w.json")
    env = [
        (p.name, p.container.env.get("CUDA_VISIBLE_DEVICES"), p.address) for w in plan.workers for p in w.pods
    ]
    assert env == [
        ("minicpm-duplex-w0-api", None, "127.0.0.1:7001"),
        ("minicpm-duplex-w0-thinker", "2", "127.0.0.1:7002"),
        ("minicpm-duplex-w0-talker", "3", "127.0.0.1:7003"),
        ("minicpm-duplex-w1-api", None, "127.0.0.1:7011"),
        ("minicpm-duplex-w1-thinker", "4", "127.0.0.1:7012"),
        ("minicpm-duplex-w1-talker", "5", "127.0.0.1:7013"),
    ]
    assert "--workers-file" in plan.router.container.command
    assert plan.router.container.command[7] == "/run/w.json"


def test_local_vllm_reads_its_deploy_config_next_to_the_workers_file() -> None:
    plan = plan_deployment(
        example("qwen3-omni-vllm.yaml"), target=Target.local, workers_file="/run/q/workers.json"
    )
    command = plan.workers[0].pods[0].container.command
    assert command[command.index("--deploy-config") + 1] == "/run/q/deploy_config.yaml"
    assert plan.workers[0].pods[0].container.env == {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert plan.workers[1].pods[0].container.env == {"CUDA_VISIBLE_DEVICES": "3,4,5"}


def test_multi_node_thinker_spans_pods_with_rendezvous_env() -> None:
    dep = deployment("big", **{"model.thinkerParamsBillions": 400, "stages.thinker.tensorParallelSize": 16})
    plan = plan_deployment(dep)
    pods = plan.workers[0].pods
    assert [(p.name, p.hostname, p.logical_gpus, p.node_rank, p.nnodes, p.container.gpus) for p in pods] == [
        ("big-w0-api", "api", (), 0, 1, 0),
        ("big-w0-thinker", "thinker", tuple(range(8)), 0, 2, 8),
        ("big-w0-thinker-1", "thinker-1", tuple(range(8, 16)), 1, 2, 8),
        ("big-w0-talker", "talker", (16,), 0, 1, 1),
    ]
    leader, follower = pods[1], pods[2]
    master = "thinker.big-w0.default.svc.cluster.local"
    assert leader.container.env == {
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "NODE_RANK": "0",
        "NNODES": "2",
    }
    assert follower.container.env == {
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "NNODES": "2",
    }
    assert leader.container.ports == {"thinker": 9100, "dist": 29500}
    assert follower.stages == (S.thinker,)
    assert follower.address == "thinker-1.big-w0.default.svc.cluster.local:9100"
    # GPU ids in commands are pod-local on every node.
    command = follower.container.command
    assert command[command.index("--thinker-gpus") + 1] == "0,1,2,3,4,5,6,7"
    assert command[command.index("--thinker-tp-size") + 1] == "16"
    assert plan.gpus_per_worker == 17


def test_builtin_dedicated_vision_and_streaming_speech() -> None:
    dep = deployment(
        "vis",
        **{
            "model.name": "Qwen2.5-Omni-7B",
            "pipeline": "streaming-speech",
            "stages.thinker.tensorParallelSize": 2,
            "stages.imageEncoder.tensorParallelSize": 2,
            "stages.imageEncoder.placement": "dedicated",
        },
    )
    plan = plan_deployment(dep)
    pods = {p.role: p for p in plan.workers[0].pods}
    assert {r: (p.stages, p.logical_gpus) for r, p in pods.items()} == {
        Role.api: ((S.preprocessing, S.decode, S.segmenter), ()),
        Role.thinker: ((S.audio_encoder, S.mm_aggregate, S.thinker), (0, 1)),
        Role.talker: ((S.talker, S.talker_stream), (2,)),
        Role.image_encoder: ((S.image_encoder,), (3, 4)),
    }
    vision = pods[Role.image_encoder].container.command
    assert vision[vision.index("--image-encoder-gpus") + 1] == "0,1"
    assert pods[Role.image_encoder].address == "image-encoder.vis-w0.default.svc.cluster.local:9102"
    api = pods[Role.api].container.command
    assert "image_encoder=image-encoder.vis-w0.default.svc.cluster.local:9102" in api
    assert "talker=talker.vis-w0.default.svc.cluster.local:9101" in api
    # The segmenter runs in the engine (the api pod); the vocoder follows the talker unnamed.
    assert not [a for a in api if a.startswith(("segmenter=", "talker_stream="))]
    assert plan.edges[-2:] == ((S.talker, S.segmenter), (S.segmenter, S.talker_stream))


def test_text_variant_has_no_talker() -> None:
    plan = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", "pipeline": "text"}))
    assert [p.role for p in plan.workers[0].pods] == [Role.api, Role.thinker]
    assert S.talker not in plan.stages
    assert plan.gpus_per_worker == 1


def test_audio_encoder_can_be_left_out() -> None:
    stages = plan_deployment(deployment(**{"stages.audioEncoder.enabled": False})).stages
    assert stages == (S.preprocessing, S.image_encoder, S.mm_aggregate, S.thinker, S.decode, S.talker)
    assert (S.preprocessing, S.audio_encoder) not in pipeline_edges(stages)


def test_mem_fraction_defaults_by_tier() -> None:
    tiers = {"h100": 0.8, "a100-80gb": 0.8, "h200": 0.9, "b200": 0.9, "l40s": 0.8}
    got = {t: plan_deployment(deployment(**{"gpu.tier": t})).mem_fraction_static for t in tiers}
    assert got == tiers
    explicit = deployment(**{"gpu.tier": "h200", "stages.thinker.memFractionStatic": 0.85})
    assert plan_deployment(explicit).mem_fraction_static == 0.85


def test_architecture_detection_from_name_and_path() -> None:
    names = {
        "Qwen/Qwen2.5-Omni-7B": "qwen2_5_omni",
        "qwen2_5_omni_3b": "qwen2_5_omni",
        "Qwen3-Omni-30B-A3B-Instruct": "qwen3_omni",
        "inclusionAI/Ming-flash-omni-2.0": "ming_omni",
        "openbmb/MiniCPM-o-2_6": "minicpm_o",
        "my-model": "auto",
    }
    got = {
        n: plan_deployment(
            deployment(**{"model.name": n, "stages.thinker.tensorParallelSize": 4})
        ).architecture
        for n in names
    }
    assert got == names


def test_revision_tracks_the_worker_template_only() -> None:
    base = deployment(**{"model.name": "Qwen2.5-Omni-7B"})
    rev = worker_revision(base.spec)
    assert len(rev) == 10
    more_workers = deployment(**{"model.name": "Qwen2.5-Omni-7B", "workers": 3, "router.replicas": 2})
    assert worker_revision(more_workers.spec) == rev
    new_image = deployment(**{"model.name": "Qwen2.5-Omni-7B", "runtime.image": "example/omni:2"})
    assert worker_revision(new_image.spec) != rev


def test_pod_revision_changes_only_for_the_changed_role() -> None:
    before = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", "workers": 2}))
    after = plan_deployment(
        deployment(
            **{"model.name": "Qwen2.5-Omni-7B", "workers": 2, "stages.talker.args": ["--talker-batch", "4"]}
        )
    )
    assert before.revision != after.revision

    def revisions(plan):  # role -> pod revision, identical across the workers of one plan
        per_worker = [{p.role: p.revision for p in w.pods} for w in plan.workers]
        assert per_worker[0] == per_worker[1]
        return per_worker[0]

    old, new = revisions(before), revisions(after)
    assert old[Role.api] == new[Role.api]
    assert old[Role.thinker] == new[Role.thinker]
    assert old[Role.talker] != new[Role.talker]


def test_zero_workers_plans_the_router_only() -> None:
    plan = plan_deployment(deployment(**{"workers": 0}))
    assert plan.workers == ()
    assert plan.router.replicas == 1


def test_router_auth_and_namespace() -> None:
    dep = deployment(**{"router.auth": {"secretName": "keys", "key": "tokens"}, "router.port": 80})
    dep = dep.model_copy(update={"metadata": dep.metadata.model_copy(update={"namespace": "ai"})})
    plan = plan_deployment(dep)
    assert plan.router.container.command[-2:] == ("--api-keys-file", "/etc/omni/auth/tokens")
    assert (plan.router.auth_secret, plan.router.auth_key, plan.router.port) == ("keys", "tokens", 80)
    assert plan.workers[0].api_url == "http://api.demo-w0.ai.svc.cluster.local:8000"


def test_third_party_router_uses_the_omni_image() -> None:
    plan = plan_deployment(example("qwen3-omni-vllm.yaml"))
    assert plan.workers[0].pods[0].container.image == "vllm/vllm-omni:latest"
    assert plan.router.container.image == "ghcr.io/omni-dev/omni-runtime:0.1.0"


def test_image_overrides_per_role() -> None:
    dep = deployment(
        **{
            "runtime.image": "base:1",
            "runtime.stageImages": {"talker": "talker:1", "api": "api:1"},
            "stages.thinker.image": "thinker:2",
        }
    )
    pods = {p.role: p.container.image for p in plan_deployment(dep).workers[0].pods}
    assert pods == {Role.api: "api:1", Role.thinker: "thinker:2", Role.talker: "talker:1"}


def test_every_process_of_a_tiny_qwen3_worker_on_gpus_names_the_tiny_family() -> None:
    # Each stage process writes (once, into its own cache) and loads the same seeded checkpoint.
    dep = deployment(**{"model.source.type": "tiny", "model.architecture": "qwen3_omni", "gpu.tier": "h100"})
    plan = plan_deployment(dep, target=Target.local, base_port=7000)
    got = [(p.role, p.container.command[:8]) for p in plan.workers[0].pods]
    assert got == [
        (Role.api, ("omni", "serve", "--tiny-family", "qwen3_omni_moe", "--model-name", "demo-model", "--pipeline", "speech")),
        (Role.thinker, ("omni", "stage", "--stages", "audio_encoder,image_encoder,mm_aggregate,thinker", "--tiny-family",
                        "qwen3_omni_moe", "--model-name", "demo-model")),
        (Role.talker, ("omni", "stage", "--stages", "talker", "--tiny-family", "qwen3_omni_moe", "--model-name",
                       "demo-model")),
    ]  # fmt: skip
    qwen25 = plan_deployment(
        deployment(**{"model.source.type": "tiny", "gpu.tier": "h100"}), target=Target.local
    )
    assert not [p for p in qwen25.workers[0].pods if "--tiny-family" in p.container.command]
