"""Bad input found by an audit of the CLI and the spec: each is one line on stderr naming the field
(or flag) and the fix, with exit code 2, through the real console script.

Before: a CPU quantity of inf/nan/1e400 crashed `omni render` (and the operator's reconcile) in
OMP_NUM_THREADS sizing; YAML nested too deeply or a number past 4300 digits was a traceback; `omni up`
crashed binding a worker port past 65535 and started a router on a worker's port; inf/nan numbers,
NUL characters, rollout durations past float range, unknown stageImages roles, bad quantities and
Kubernetes names, and a bad namespace passed the loader (and the CRD) to fail later, or never.
"""

from __future__ import annotations

import copy
import functools
import socket
import subprocess
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from omni_operator import crdgen
from omni_operator.api.kube_rules import ABSOLUTE_PATH_PATTERN, LABEL_KEY_FIX
from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.spec import (
    DNS_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    SECRET_KEY_PATTERN,
    SUB_PATH_PATTERN,
)
from omni_operator.local.processes import busy_ports
from omni_operator.plan.types import Container
from omni_operator.render.common import cpu_thread_env

ROOT = Path(__file__).resolve().parents[3]
OMNI = ROOT / ".venv" / "bin" / "omni"
TINY = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
SCHEMA = crdgen.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(autouse=True)
def _console_script() -> None:
    """These tests run the real console script: a missing one fails them (never a skip)."""
    assert OMNI.exists(), f"{OMNI} is missing: `make setup` installs it"


NUL = "holds a NUL character, which no command line or environment variable can carry; remove it"
CPU_FIX = "use a Kubernetes CPU quantity such as '2', '500m' or '1.5'"
MEMORY_FIX = "use a Kubernetes memory quantity such as '32Gi', '512Mi' or '4G'"
LABEL_FIX = "use lowercase letters, digits and '-', starting and ending with a letter or digit (at most 63 characters)"
PREPROCESSING = "spec.stages.preprocessing.resources"


def omni(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OMNI), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr == message + "\n"


def tiny_with(edits: dict[str, Any]) -> dict:
    """examples/tiny-cpu.yaml with dotted-path edits."""
    doc = copy.deepcopy(TINY)
    for path, value in edits.items():
        *parents, last = path.split(".")
        functools.reduce(lambda node, key: node.setdefault(key, {}), parents, doc)[last] = value
    return doc


SPEC_CASES = [
    pytest.param({f"{PREPROCESSING}.cpu": "inf"}, f"{PREPROCESSING}.cpu: 'inf' does not match {QUANTITY_PATTERN}; {CPU_FIX}", id="cpu-inf"),
    pytest.param({f"{PREPROCESSING}.cpu": "nan"}, f"{PREPROCESSING}.cpu: 'nan' does not match {QUANTITY_PATTERN}; {CPU_FIX}", id="cpu-nan"),
    pytest.param({f"{PREPROCESSING}.cpu": "1e400"}, f"{PREPROCESSING}.cpu: '1e400' does not match {QUANTITY_PATTERN}; {CPU_FIX}", id="cpu-1e400"),
    pytest.param({f"{PREPROCESSING}.cpu": "-2"}, f"{PREPROCESSING}.cpu: '-2' does not match {QUANTITY_PATTERN}; {CPU_FIX}", id="cpu-negative"),
    pytest.param({"spec.router.resources.memory": "32GB"}, f"spec.router.resources.memory: '32GB' does not match {QUANTITY_PATTERN}; {MEMORY_FIX}", id="memory-GB"),
    pytest.param({"spec.stages.thinker.resources.cpu": "x" * 65}, "spec.stages.thinker.resources.cpu: is longer than 64 characters; shorten it to 64 or fewer", id="cpu-too-long"),
    pytest.param({"spec.gpu.memoryGb": float("inf")}, "spec.gpu.memoryGb: inf is not a finite number; use a finite number", id="memory-gb-inf"),
    pytest.param({"spec.model.thinkerParamsBillions": float("nan")}, "spec.model.thinkerParamsBillions: nan is not a finite number; use a finite number", id="params-nan"),
    pytest.param({"spec.rollout.drainTimeoutSeconds": 10**400}, "spec.rollout.drainTimeoutSeconds: a number of more than 40 digits is above the maximum 2147483647; use a value <= 2147483647", id="drain-past-float"),
    pytest.param({"spec.rollout.progressDeadlineSeconds": 2**31}, "spec.rollout.progressDeadlineSeconds: 2147483648 is above the maximum 2147483647; use a value <= 2147483647", id="deadline-past-int32"),
    pytest.param({"spec.rollout.maxSurge": 1025}, "spec.rollout.maxSurge: 1025 is above the maximum 1024; use a value <= 1024", id="surge-past-workers"),
    pytest.param({"spec.streamingInput.minLengthBytes": 2**34 + 1}, "spec.streamingInput.minLengthBytes: 17179869185 is above the maximum 17179869184; use a value <= 17179869184", id="min-length-past-payload"),
    pytest.param({"spec.streamingInput.minLengthBytes": 10**30}, "spec.streamingInput.minLengthBytes: 1000000000000000000000000000000 is above the maximum 17179869184; use a value <= 17179869184", id="min-length-huge"),
    pytest.param({"spec.router.limits.requestTimeoutSeconds": 2**31}, "spec.router.limits.requestTimeoutSeconds: 2147483648 is above the maximum 2147483647; use a value <= 2147483647", id="router-timeout"),
    pytest.param({"spec.runtime.env": {"FOO": "a\0b"}}, f"spec.runtime.env.FOO: {NUL}", id="env-value-nul"),
    pytest.param({"spec.runtime.extraArgs": ["--ok", "--x\0"]}, f"spec.runtime.extraArgs: item 1 {NUL}", id="extra-args-nul"),
    pytest.param({"spec.model.name": "tiny\0omni"}, f"spec.model.name: {NUL}", id="model-name-nul"),
    pytest.param({"spec.runtime.env": {1: "x"}}, "spec.runtime.env.1: the name 1 is not a string; quote it: '1'", id="env-name-number"),
    pytest.param({"spec.runtime.stageImages": {"thinkr": "img:1"}}, "spec.runtime.stageImages.thinkr: is not a stage pod role; use one of worker, api, thinker, talker, image-encoder", id="stage-images-typo"),
    pytest.param({"metadata.namespace": "Bad_NS"}, f"metadata.namespace: 'Bad_NS' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$; {LABEL_FIX}", id="namespace"),
    pytest.param({"spec.router.auth": {"secretName": "Api_Keys"}}, f"spec.router.auth.secretName: 'Api_Keys' does not match {DNS_SUBDOMAIN_PATTERN}; use the Secret's name: lowercase letters, digits, '-' and '.'", id="secret-name"),
    pytest.param({"spec.router.auth": {"secretName": "keys", "key": "../keys"}}, f"spec.router.auth.key: '../keys' does not match {SECRET_KEY_PATTERN}; use letters, digits, '-', '_' and '.', not starting with '..'", id="secret-key-dotdot"),
    pytest.param({"spec.model.source": {"type": "pvc", "claimName": "models", "subPath": "/models"}}, f"spec.model.source.subPath: '/models' does not match {SUB_PATH_PATTERN}; use a path inside the volume, relative and without '..' elements, such as 'models/qwen'", id="sub-path-absolute"),
    pytest.param({"spec.model.source": {"type": "pvc", "claimName": "models", "subPath": "../other"}}, f"spec.model.source.subPath: '../other' does not match {SUB_PATH_PATTERN}; use a path inside the volume, relative and without '..' elements, such as 'models/qwen'", id="sub-path-up"),
    pytest.param({"spec.model.source": {"type": "pvc", "claimName": "models", "subPath": "a/../../b"}}, f"spec.model.source.subPath: 'a/../../b' does not match {SUB_PATH_PATTERN}; use a path inside the volume, relative and without '..' elements, such as 'models/qwen'", id="sub-path-up-inside"),
    pytest.param({"spec.model.source": {"type": "pvc", "claimName": "models", "subPath": "a//b"}}, f"spec.model.source.subPath: 'a//b' does not match {SUB_PATH_PATTERN}; use a path inside the volume, relative and without '..' elements, such as 'models/qwen'", id="sub-path-empty-element"),
    pytest.param({"spec.gpu.nodeSelector": {"gpu type": "h100"}}, f"spec.gpu.nodeSelector.gpu type: is not a label key; {LABEL_KEY_FIX}", id="node-selector-key"),
    pytest.param({"spec.gpu.tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]}, "spec.gpu.tolerations[0]: operator Exists takes no value; remove value, or use operator: Equal", id="toleration-exists-value"),
    pytest.param({"spec.model.path": "models/tiny"}, f"spec.model.path: 'models/tiny' does not match {ABSOLUTE_PATH_PATTERN}; use an absolute path without '..' elements, such as '/models/model'", id="model-path-relative"),
    pytest.param({"spec.model.source": {"type": "hostPath", "hostPath": "/mnt/../etc"}}, f"spec.model.source.hostPath: '/mnt/../etc' does not match {ABSOLUTE_PATH_PATTERN}; use the node directory's absolute path, without '..' elements, such as '/mnt/models'", id="host-path-up"),
    pytest.param({"spec.model.source": {"type": "pvc", "claimName": "My Models"}}, f"spec.model.source.claimName: 'My Models' does not match {DNS_SUBDOMAIN_PATTERN}; use the PersistentVolumeClaim's name: lowercase letters, digits, '-' and '.'", id="claim-name"),
]  # fmt: skip


@pytest.mark.parametrize(("edits", "message"), SPEC_CASES)
@pytest.mark.parametrize("command", ["render", "plan"])
def test_bad_spec_is_one_line_naming_the_field(
    tmp_path: Path, command: str, edits: dict[str, Any], message: str
) -> None:
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(tiny_with(edits)))
    assert_clean_error(omni(command, "-f", str(path)), f"omni {command}: error: {path}: {message}")


TINY_TEXT = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
RAW_CASES = [
    pytest.param(
        "spec: " + "[" * 5000 + "]" * 5000 + "\n",
        "the YAML is nested too deeply to read; write the OmniDeployment as a plain mapping (see examples/)",
        id="nested-too-deeply",
    ),
    pytest.param(
        TINY_TEXT.replace("workers: 2", "workers: " + "9" * 5000),
        "a number in the YAML has more than 4300 digits; write every number with fewer digits",
        id="past-the-digit-limit",
    ),
]


@pytest.mark.parametrize(("text", "message"), RAW_CASES)
def test_yaml_python_cannot_read_is_a_spec_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "raw.yaml").write_text(text)
    result = omni("render", "-f", "raw.yaml", cwd=tmp_path)
    assert_clean_error(result, f"omni render: error: raw.yaml: {message}")


DUPLICATE_KEY_CASES = [
    pytest.param(TINY_TEXT.replace("  workers: 2\n", "  workers: 2\n  workers: 1\n"), "20: spec.workers: duplicate key 'workers' (first on line 19)", id="workers"),
    pytest.param(TINY_TEXT.replace("    tier: cpu\n", "    tier: cpu\n    tier: h100\n"), "22: spec.gpu.tier: duplicate key 'tier' (first on line 21)", id="gpu-tier"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), DUPLICATE_KEY_CASES)
@pytest.mark.parametrize("command", ["render", "plan"])
def test_a_duplicate_key_is_refused_naming_it_and_its_line(
    tmp_path: Path, command: str, text: str, message: str
) -> None:
    (tmp_path / "dup.yaml").write_text(text)
    result = omni(command, "-f", "dup.yaml", cwd=tmp_path)
    assert_clean_error(
        result,
        f"omni {command}: error: dup.yaml:{message}; keep one of them: YAML would silently use the last",
    )


@pytest.mark.parametrize("command", ["render", "plan"])
def test_namespace_flag_is_checked_like_metadata_namespace(command: str) -> None:
    assert_clean_error(
        omni(command, "-f", str(ROOT / "examples" / "tiny-cpu.yaml"), "-n", "Bad_NS"),
        f"omni {command}: error: --namespace: 'Bad_NS' is not a namespace name; {LABEL_FIX}",
    )


@pytest.mark.parametrize("quantity", ["2", "500m", "1.5", ".5", "32Gi", "512Mi", "4G", "1e3", "100k"])
def test_good_quantities_still_load(quantity: str) -> None:
    doc = tiny_with({f"{PREPROCESSING}.cpu": quantity, f"{PREPROCESSING}.memory": quantity})
    (dep,) = parse_deployments(yaml.safe_dump(doc))
    assert dep.spec.stages.preprocessing.resources.cpu == quantity


@pytest.mark.parametrize(
    "sub_path", ["models/qwen", "qwen", "a/b/", ".cache/x", "./a", "..x/y", "x..y", "a/..."]
)
def test_good_sub_paths_still_load(sub_path: str) -> None:
    source = {"type": "pvc", "claimName": "models", "subPath": sub_path}
    (dep,) = parse_deployments(yaml.safe_dump(tiny_with({"spec.model.source": source})))
    assert dep.spec.model.source.sub_path == sub_path


def test_every_stage_image_role_still_loads() -> None:
    roles = {r: "img:1" for r in ("worker", "api", "thinker", "talker", "image-encoder")}
    (dep,) = parse_deployments(yaml.safe_dump(tiny_with({"spec.runtime.stageImages": roles})))
    assert dep.spec.runtime.stage_images == roles


# --- the CRD says the same: the pattern is the loader's, the stageImages rule has its words ---


STAGE_IMAGES_RULE = next(
    r for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"] if "stageImages" in r["rule"]
)


def _stage_images_refusal(spec: dict) -> str | None:
    """What the API server says for `spec` by the stageImages rule (None: it passes)."""
    env, activation = celpy.Environment(), {"self": celpy.json_to_cel(spec)}
    if env.program(env.compile(STAGE_IMAGES_RULE["rule"])).evaluate(activation):
        return None
    return str(env.program(env.compile(STAGE_IMAGES_RULE["messageExpression"])).evaluate(activation))


def test_cel_refuses_an_unknown_stage_image_role_with_the_loaders_message() -> None:
    doc = tiny_with({"spec.runtime.stageImages": {"api": "a:1", "thinkr": "img:1"}})
    with pytest.raises(SpecError) as caught:
        parse_deployments(yaml.safe_dump(doc), file="f")
    loader = str(caught.value).removeprefix("f: ")
    assert _stage_images_refusal(doc["spec"]) == loader
    assert _stage_images_refusal(tiny_with({"spec.runtime.stageImages": {"thinker": "t:1"}})["spec"]) is None
    assert _stage_images_refusal(TINY["spec"]) is None


def test_crd_carries_the_quantity_pattern_and_the_bounds() -> None:
    spec = SCHEMA["properties"]["spec"]["properties"]
    resources = spec["stages"]["properties"]["preprocessing"]["properties"]["resources"]["properties"]
    assert resources["cpu"]["pattern"] == resources["memory"]["pattern"] == QUANTITY_PATTERN
    rollout = spec["rollout"]["properties"]
    assert rollout["drainTimeoutSeconds"]["maximum"] == 2**31 - 1
    assert rollout["maxSurge"]["maximum"] == 1024
    assert spec["runtime"]["properties"]["stageImages"]["maxProperties"] == 5
    streaming = spec["streamingInput"]["properties"]
    assert streaming["minLengthBytes"]["maximum"] == streaming["maxPayloadPerSession"]["maximum"] == 2**34


# --- defences behind the spec ---


@pytest.mark.parametrize("cpu", ["inf", "nan", "1e400", "-inf"])
def test_cpu_thread_env_never_crashes_on_a_non_finite_cpu(cpu: str) -> None:
    assert cpu_thread_env(Container(image="i", command=("omni",), cpu=cpu)) == {}


def test_busy_ports_counts_a_port_past_65535_as_busy() -> None:
    assert busy_ports([65536, 70000]) == [65536, 70000]


# --- omni up and omni operator flags ---


def _free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if 2 <= port <= 65000:
            return port


def _up(
    tmp_path_factory: pytest.TempPathFactory, *flags: str, workers: int
) -> subprocess.CompletedProcess[str]:
    state = tmp_path_factory.mktemp("up")  # short: the control socket path must fit in sun_path
    spec = state / "dep.yaml"
    edits = {"metadata.name": "up-audit", "spec.workers": workers, "spec.pipeline": "text"}
    spec.write_text(yaml.safe_dump(tiny_with(edits)))
    return omni("up", "--state-dir", str(state / "s"), "-f", str(spec), *flags)


def test_up_refuses_worker_ports_past_65535(tmp_path_factory: pytest.TempPathFactory) -> None:
    result = _up(tmp_path_factory, "--base-port", "65000", "--port", str(_free_port()), workers=60)
    assert_clean_error(
        result,
        "omni up: error: --base-port: up-audit-w54 would listen on port 65541, past 65535; lower --base-port "
        "or spec.workers (worker i uses ports base+10*i+1 to base+10*i+4)",
    )


def test_up_refuses_a_router_port_a_worker_uses(tmp_path_factory: pytest.TempPathFactory) -> None:
    port = _free_port()
    result = _up(tmp_path_factory, "--base-port", str(port - 1), "--port", str(port), workers=1)
    assert_clean_error(
        result,
        f"omni up: error: --port {port}: up-audit-w0 listens there too (worker i uses ports base+10*i+1 to "
        "base+10*i+4); pick a --port outside them, or another --base-port",
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--resync-seconds", "-1"],
            "--resync-seconds -1.0: expected a number of seconds above 0 (default 60)",
        ),
        (
            ["--resync-seconds", "0"],
            "--resync-seconds 0.0: expected a number of seconds above 0 (default 60)",
        ),
        (
            ["--resync-seconds", "nan"],
            "--resync-seconds nan: expected a number of seconds above 0 (default 60)",
        ),
        (
            ["--resync-seconds", "inf"],
            "--resync-seconds inf: expected a number of seconds above 0 (default 60)",
        ),
        (["--peering-lifetime", "0"], "--peering-lifetime 0: expected 1 or more seconds (default 60)"),
    ],
    ids=["resync-negative", "resync-zero", "resync-nan", "resync-inf", "peering-lifetime-zero"],
)
def test_operator_flags(flags: list[str], message: str) -> None:
    assert_clean_error(omni("operator", *flags), f"omni operator: {message}")


def test_operator_without_credentials_stops_at_once(tmp_path: Path) -> None:
    """Before: kopf's startup retried the missing kubeconfig forever, logging a traceback each time."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no $KUBECONFIG, no ~/.kube, not in a pod
    result = subprocess.run(
        [str(OMNI), "operator", "-n", "x"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert_clean_error(
        result,
        "omni operator: error: no Kubernetes credentials: not in a pod with a service account, and $KUBECONFIG "
        "or ~/.kube/config: Invalid kube-config file. No configuration found; run the operator in the cluster "
        "(helm install) or point --kubeconfig at a cluster's kubeconfig",
    )


def test_operator_with_a_malformed_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    result = omni("operator", "--kubeconfig", str(kubeconfig), "-n", "x")
    assert_clean_error(
        result,
        f"omni operator: error: no Kubernetes credentials: not in a pod with a service account, and --kubeconfig "
        f"{kubeconfig}: while parsing a flow node expected the node content, but found '<stream end>' in "
        f'"{kubeconfig}", line 2, column 1; run the operator in the cluster (helm install) or point --kubeconfig '
        "at a cluster's kubeconfig",
    )
