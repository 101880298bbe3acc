"""Every rendered sglang-omni and vllm-omni command (and deploy config) goes through the released
packages' own CLI parsers and config loaders, with the intended placement (see peer_check.py).

Table: every example with a peer runtime, and every (release, family, variant) the support
tables in plan/catalogue.py claim, at thinker TP 2 and 4 (plus dedicated TP2 vision where the
family places vision), with the engine options the spec can set.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from peer_runs import run_checker

from omni_operator.api.load import load_deployments
from omni_operator.api.spec import Architecture, OmniDeployment, PipelineVariant
from omni_operator.plan import adapters, plan_deployment
from omni_operator.plan.catalogue import SGLANG_OMNI, VLLM_OMNI
from omni_operator.plan.types import Plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

# What a checkpoint of each family tells vllm-omni (config.json's model_type, its HF config).
VLLM_MODEL_TYPES: dict[Architecture, tuple[str, dict[str, Any] | None]] = {
    Architecture.qwen2_5_omni: ("qwen2_5_omni", None),
    Architecture.qwen3_omni: (
        "qwen3_omni_moe",
        {"class": "Qwen3OmniMoeConfig", "kwargs": {"enable_audio_output": True}},
    ),
    Architecture.minicpm_o: ("minicpmo_4_5", None),
    Architecture.ming_omni: ("ming_flash_omni", None),
}
MODEL_NAMES = {
    Architecture.qwen2_5_omni: "Qwen2.5-Omni-7B",
    Architecture.qwen3_omni: "Qwen3-Omni-30B-A3B-Instruct",
    Architecture.minicpm_o: "MiniCPM-o-4_5",
    Architecture.ming_omni: "Ming-flash-omni-2.0",
}


def _deployment(
    runtime: str, version: str, family: Architecture, variant: PipelineVariant, **stages: Any
) -> OmniDeployment:
    name = MODEL_NAMES[family]
    spec = {
        "model": {"name": name, "path": f"/models/{name}", "architecture": family.value},
        "runtime": {"type": runtime, "version": version},
        "pipeline": variant.value,
        "gpu": {"tier": "h200"},
        "stages": stages,
    }
    return OmniDeployment.model_validate({"metadata": {"name": "peer"}, "spec": spec})


def _placements(vision: bool) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {"thinker": {"tensorParallelSize": 2}},
        {"thinker": {"tensorParallelSize": 4, "quantization": "fp8", "cpuOffloadGb": 4}},
    ]
    if vision:
        found.append(
            {
                "thinker": {"tensorParallelSize": 2},
                "imageEncoder": {"placement": "dedicated", "tensorParallelSize": 2},
            }
        )
    return found


def _sglang_table() -> list[OmniDeployment]:
    return [
        _deployment("sglang-omni", version, family, variant, **placement)
        for version, families in SGLANG_OMNI.items()
        for family, info in families.items()
        for variant in info.variants
        for placement in _placements(info.vision_tp)
    ]


def _vllm_table() -> list[OmniDeployment]:
    return [
        _deployment("vllm-omni", version, family, variant, **placement)
        for version, families in VLLM_OMNI.items()
        for family, variants in families.items()
        for variant in variants
        for placement in _placements(False)
    ]


def _examples(runtime: str) -> list[OmniDeployment]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        found += [d for d in load_deployments(path) if d.spec.runtime.type.value == runtime]
    return found


SGLANG = _examples("sglang-omni") + _sglang_table()
VLLM = _examples("vllm-omni") + _vllm_table()


def _id(dep: OmniDeployment) -> str:
    s = dep.spec
    return (
        f"{dep.metadata.name}-{s.model.architecture.value}-{s.pipeline.value}-tp{s.stages.thinker.tensor_parallel_size}"
        f"-{s.stages.image_encoder.placement.value}"
    )


@functools.cache
def _sglang_results(site: str) -> list[dict[str, Any]]:
    cases = []
    for dep in SGLANG:
        plan = plan_deployment(dep)
        family = SGLANG_OMNI[plan.runtime_version][Architecture(plan.architecture)]
        for pod in (w.pods[0] for w in plan.workers):
            cases.append({"argv": list(pod.container.command), "architecture": family.architecture})
    return run_checker("sglang-omni", site, cases)


@functools.cache
def _vllm_results(site: str) -> list[dict[str, Any]]:
    cases = []
    for dep in VLLM:
        plan = plan_deployment(dep)
        model_type, hf_config = VLLM_MODEL_TYPES[Architecture(plan.architecture)]
        for pod in (w.pods[0] for w in plan.workers):
            command = list(pod.container.command)
            assert command[:3] == ["sh", "-c", adapters.VLLM_PRELUDE]
            cases.append(
                {
                    "argv": command[3:],
                    "deploy_config": plan.config_files[adapters.VLLM_DEPLOY_CONFIG],
                    "deploy_dir_env": adapters.VLLM_DEPLOY_DIR_ENV,
                    "model_type": model_type,
                    "hf_config": hf_config,
                }
            )
    return run_checker("vllm-omni", site, cases)


def _pods(plan: Plan) -> int:
    return len(plan.workers)


def _offset(deps: list[OmniDeployment], index: int) -> int:
    return sum(_pods(plan_deployment(d)) for d in deps[:index])


@pytest.mark.parametrize("index", range(len(SGLANG)), ids=[_id(d) for d in SGLANG])
def test_sglang_omni_accepts_the_command_with_its_placement(index: int, sglang_site: str) -> None:
    dep = SGLANG[index]
    plan = plan_deployment(dep)
    family = SGLANG_OMNI[plan.runtime_version][Architecture(plan.architecture)]
    variant = family.variants[dep.spec.pipeline]
    start = _offset(SGLANG, index)
    for worker, result in zip(
        plan.workers, _sglang_results(sglang_site)[start : start + _pods(plan)], strict=True
    ):
        assert result["ok"], result["error"]
        stages = result["stages"]
        thinker = [g for g in worker.pods[0].logical_gpus][: dep.spec.stages.thinker.tensor_parallel_size]
        assert stages["thinker"]["gpu"] == thinker
        assert stages["thinker"]["tp_size"] == len(thinker)
        engine = stages["thinker"]["engine"]
        assert engine["mem_fraction_static"] == plan.mem_fraction_static
        if dep.spec.stages.thinker.quantization is not None:
            assert engine["quantization"] == dep.spec.stages.thinker.quantization.value
            assert engine["cpu_offload_gb"] == dep.spec.stages.thinker.cpu_offload_gb
        for stage in variant.talker_stages:
            assert stages[stage]["gpu"] == len(thinker), stage
        if dep.spec.stages.image_encoder.placement.value == "dedicated":
            vision = dep.spec.stages.image_encoder.tensor_parallel_size
            start_gpu = len(thinker) + (1 if variant.talker_stages else 0)
            assert stages["image_encoder"] == {
                "gpu": list(range(start_gpu, start_gpu + vision)),
                "tp_size": vision,
                "engine": {},
            }
        serve = result["serve"]
        assert (serve["host"], serve["port"], serve["model_name"]) == ("0.0.0.0", 8000, dep.spec.model.name)
        assert serve["enable_realtime"] is variant.realtime


@pytest.mark.parametrize("index", range(len(VLLM)), ids=[_id(d) for d in VLLM])
def test_vllm_omni_accepts_the_command_and_deploy_config_with_its_placement(
    index: int, vllm_site: str
) -> None:
    dep = VLLM[index]
    plan = plan_deployment(dep)
    family = Architecture(plan.architecture)
    variant = VLLM_OMNI[plan.runtime_version][family][dep.spec.pipeline]
    start = _offset(VLLM, index)
    for result in _vllm_results(vllm_site)[start : start + _pods(plan)]:
        assert result["ok"], result.get("trace") or result["error"]
        args = result["args"]
        assert (args["model_tag"], args["omni"], args["port"]) == (dep.spec.model.path, True, 8000)
        assert args["served_model_name"] == [dep.spec.model.name]
        assert args["deploy_config"] == f"/etc/omni/{adapters.VLLM_DEPLOY_CONFIG}"
        if variant.pipeline is not None:
            assert result["pipeline"] == variant.pipeline
        stages = result["stages"]
        assert len(stages) == variant.stages
        tp = dep.spec.stages.thinker.tensor_parallel_size
        thinker = stages[0]
        assert thinker["devices"] == ",".join(str(g) for g in range(tp))
        assert thinker["engine_args"]["tensor_parallel_size"] == tp
        assert thinker["engine_args"]["gpu_memory_utilization"] == plan.mem_fraction_static
        if dep.spec.stages.thinker.quantization is not None:
            assert thinker["engine_args"]["quantization"] == "fp8"
            assert thinker["engine_args"]["cpu_offload_gb"] == 4
        for stage in stages[1:]:
            assert stage["devices"] == str(tp), stage["model_stage"]
        # The shipped file's memory fractions (and sampling defaults) survive the overlay, and the
        # stages that share the talker GPU fit on it together.
        assert sum(stage["engine_args"]["gpu_memory_utilization"] for stage in stages[1:]) <= 0.95 + 1e-9
        assert all(stage["default_sampling_params"] for stage in stages)
        expected_mode = "duplex" if dep.spec.pipeline is PipelineVariant.duplex else "turn"
        assert result["session_mode"] == expected_mode
        if dep.spec.pipeline is PipelineVariant.streaming_speech:
            assert result["async_chunk"] is True


def test_the_old_spellings_are_refused_by_the_releases(sglang_site: str, vllm_site: str) -> None:
    """What the adapters wrote before (the seed cookbook's flags; stage_args) fails with the real code."""
    old_sglang = ["sgl-omni", "serve", "--model-path", "/m", "--thinker-tp-size", "4", "--trust-remote-code"]
    (sglang,) = run_checker(
        "sglang-omni",
        sglang_site,
        [{"argv": old_sglang, "architecture": "BailingMM2NativeForConditionalGeneration"}],
    )
    assert not sglang["ok"]
    assert "Missing value for argument" in sglang["error"]
    (vllm,) = run_checker(
        "vllm-omni",
        vllm_site,
        [
            {
                "argv": ["vllm-omni", "serve", "/m", "--omni", "--deploy-config", "/etc/omni/old.yaml"],
                "deploy_config": "stage_args:\n- stage_id: 0\n",
                "deploy_dir_env": adapters.VLLM_DEPLOY_DIR_ENV,
                "model_type": "qwen2_5_omni",
                "hf_config": None,
            }
        ],
    )
    assert not vllm["ok"]
    assert "uses the removed `stage_args` schema" in vllm["error"]
