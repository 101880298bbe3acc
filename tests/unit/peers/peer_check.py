"""Runs in a subprocess: checks rendered peer-runtime commands with the released packages' own code.

Input (stdin, JSON): {"runtime": "sglang-omni" | "vllm-omni", "site": <install dir>, "cases": [...]}.
Output (stdout, last line, JSON): one result per case.

sglang-omni case {"argv": [...], "architecture": <HF architecture>}: the real `sgl-omni` Typer app
runs `serve` with the argv (the real option parsing, variant selection, dotted-flag patches,
config merge and validation); launch_server is replaced so nothing starts, and the registry is
asked for the architecture's config class instead of reading a checkpoint's config.json.
Result: the merged config's class and every stage's gpu / tp_size / engine overrides.

vllm-omni case {"argv": [...], "deploy_config": <text>, "deploy_dir_env": <name>, "model_type": <the
checkpoint's registry key>, "hf_config": {"class": <transformers config class>, "kwargs": {...}} or null}: the real serve
subparser parses the argv (vllm-omni's own options; vLLM's generic server options come from the
shim's small make_arg_parser), then the deploy config is written where --deploy-config points
and loaded by vllm-omni's own load_deploy_config (base_config layering on the shipped file),
its pipeline resolved from OMNI_PIPELINES, and merged by merge_pipeline_deploy for CUDA.
Result: the parsed options and every merged stage's devices and engine args.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any

import peer_shim

SGLANG_STUBS = frozenset(
    {"msgspec", "msgpack", "sglang", "zmq", "pybase64", "torchaudio", "xxhash", "torchada"}
)
VLLM_STUBS = frozenset(
    {
        "vllm",
        "aenum",
        "msgspec",
        "prettytable",
        "pybase64",
        "diffusers",
        # The API server and its stage-override helpers: what `serve` would launch, not parse.
        "vllm_omni.entrypoints.openai",
        "vllm_omni.entrypoints.utils",
    }
)


def _sglang(site: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    peer_shim.install(SGLANG_STUBS)
    import sglang.srt.platforms as srt_platforms  # the stub

    srt_platforms.current_platform = types.SimpleNamespace(is_cuda=lambda: True)
    sys.path.insert(0, site)
    import sglang_omni.cli.serve as serve_module
    import sglang_omni.config.manager as manager
    from sglang_omni.cli import app
    from sglang_omni.models.registry import PIPELINE_CONFIG_REGISTRY
    from typer.testing import CliRunner

    captured: dict[str, Any] = {}

    def launch_server(config: Any, **kwargs: Any) -> None:
        captured.update(config=config, kwargs=kwargs)
        raise SystemExit(0)

    serve_module.launch_server = launch_server
    serve_module.should_disable_custom_all_reduce_for_gpus = lambda gpu_ids: True
    results = []
    for case in cases:
        captured.clear()
        architecture = case["architecture"]
        manager.resolve_config_cls_for_model_path = lambda path, a=architecture: (
            PIPELINE_CONFIG_REGISTRY.get_config(a)
        )
        argv = case["argv"]
        assert argv[:2] == ["sgl-omni", "serve"], argv[:2]
        run = CliRunner().invoke(app, argv[1:])
        if "config" not in captured:
            error = run.output.strip() or repr(run.exception)
            results.append({"ok": False, "error": error})
            continue
        config = captured["config"]
        stages = {
            s.name: {
                "gpu": s.gpu,
                "tp_size": s.tp_size,
                "engine": s.engine.overrides() if getattr(s, "engine", None) is not None else {},
            }
            for s in config.stages
        }
        serve = {k: v for k, v in captured["kwargs"].items() if isinstance(v, (str, int, float, bool))}
        results.append({"ok": True, "config_class": type(config).__name__, "stages": stages, "serve": serve})
    return results


def _vllm_make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """vLLM's generic server options that the rendered commands use (vLLM itself is not installed)."""
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--model")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--api-server-count", type=int)
    return parser


def _vllm_config_decorator(*args: Any, **kwargs: Any) -> Any:
    if args and isinstance(args[0], type):
        return dataclasses.dataclass(args[0])
    return lambda cls: dataclasses.dataclass(cls)


def _vllm(site: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    peer_shim.install(VLLM_STUBS)
    peer_shim.define("vllm", __version__="0.30.0", __version_tuple__=(0, 30, 0))
    peer_shim.define("vllm.config.utils", config=_vllm_config_decorator)
    peer_shim.define("vllm.utils.argparse_utils", FlexibleArgumentParser=argparse.ArgumentParser)
    peer_shim.define("vllm.entrypoints.launchers.cli_args", make_arg_parser=_vllm_make_arg_parser)
    sys.path[:0] = site.split(os.pathsep)
    package = Path(site.split(os.pathsep)[0]) / "vllm_omni"
    # vllm_omni/__init__.py and its config/entrypoints __init__ monkeypatch vLLM and import the
    # engine; the modules checked here are imported without them.
    for name in ("vllm_omni", "vllm_omni.config", "vllm_omni.entrypoints", "vllm_omni.entrypoints.cli"):
        peer_shim.bare_package(name, str(package.joinpath(*name.split(".")[1:])))
    import vllm_omni.config.stage_config as stage_config
    from vllm_omni.config.pipeline_registry import resolve_pipeline_config
    from vllm_omni.entrypoints.cli.serve import OmniServeCommand

    apply_platform = stage_config._apply_platform_overrides
    stage_config._apply_platform_overrides = lambda deploy, platform=None: apply_platform(deploy, "cuda")
    command = OmniServeCommand()
    parser = argparse.ArgumentParser(prog="vllm-omni")
    subparsers = parser.add_subparsers(dest="subparser")
    command.subparser_init(subparsers)
    results = []
    for case in cases:
        argv = case["argv"]
        try:
            assert argv[0] == "vllm-omni", argv[0]
            args = parser.parse_args(argv[1:])
            config_dir = Path(tempfile.mkdtemp())
            path = config_dir / Path(args.deploy_config).name
            path.write_text(case["deploy_config"])
            os.environ[case["deploy_dir_env"]] = str(package / "deploy")
            deploy = stage_config.load_deploy_config(path)
            hf_config = None
            if case.get("hf_config"):
                import transformers

                spec = case["hf_config"]
                hf_config = getattr(transformers, spec["class"])(**spec.get("kwargs", {}))
            key = deploy.pipeline or case["model_type"]
            pipeline = resolve_pipeline_config(key, hf_config)
            if pipeline is None:
                raise ValueError(f"pipeline {key!r} is not registered")
            stages = stage_config.merge_pipeline_deploy(pipeline, deploy)
        except SystemExit as exc:
            results.append({"ok": False, "error": f"argparse exit {exc.code}"})
            continue
        except Exception as exc:
            results.append(
                {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
            )
            continue
        results.append(
            {
                "ok": True,
                "args": {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list))},
                "pipeline": pipeline.model_type,
                "session_mode": deploy.session_mode,
                "async_chunk": deploy.async_chunk,
                "connectors": sorted(deploy.connectors or {}),
                "stages": [
                    {
                        "stage_id": s.stage_id,
                        "model_stage": s.model_stage,
                        "devices": s.yaml_runtime.get("devices"),
                        "engine_args": {
                            k: v
                            for k, v in s.yaml_engine_args.items()
                            if isinstance(v, (str, int, float, bool)) or v is None
                        },
                        "default_sampling_params": s.yaml_extras.get("default_sampling_params", {}),
                    }
                    for s in stages
                ],
            }
        )
    return results


def main() -> None:
    job = json.loads(sys.stdin.read())
    check = _sglang if job["runtime"] == "sglang-omni" else _vllm
    results = check(job["site"], job["cases"])
    sys.stdout.write("\n" + json.dumps(results, default=str) + "\n")


if __name__ == "__main__":
    main()
