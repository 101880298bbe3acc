"""`omni crd [-o DIR] [--check]`: the OmniDeployment CRD, generated from the pydantic models.

The models in api/ are the single source of truth; this turns their JSON schema into a
structural OpenAPI v3 schema (no $ref, `nullable` instead of anyOf-with-null, OpenAPI's boolean
exclusive bounds), adds the status and scale subresources and printer columns, and copies the
planner's static cross-field rules in as CEL validations with the planner's exact messages, so
`kubectl apply` rejects what `omni plan` would. crds/ is never edited by hand: `--check` fails
when it differs from what this module generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic.alias_generators import to_camel

from omni_operator.api import runtime_env
from omni_operator.api.kube_rules import LABEL_KEY_FIX, LABEL_KEY_REASON, NameRule, label_key_cel
from omni_operator.api.spec import (
    GPU_NAME_RULES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    STAGE_IMAGE_ROLES,
    STAGE_IMAGES_FIX,
    STAGE_IMAGES_REASON,
    VERSION,
    OmniDeploymentSpec,
    RuntimeType,
)
from omni_operator.api.status import OmniDeploymentStatus
from omni_operator.plan import rules
from omni_operator.plan.catalogue import PEER_VERSIONS, SGLANG_OMNI
from omni_runtime.contract import switches

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
Schema = dict[str, Any]
NAME_TOO_LONG = "metadata.name: is longer than 40 characters; shorten it to 40 or fewer"


def _convert(node: Schema, defs: dict[str, Schema]) -> Schema:
    """One pydantic JSON-schema node -> one structural OpenAPI v3 node."""
    if "$ref" in node:
        target = _convert(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        extra = _convert({k: v for k, v in node.items() if k != "$ref"}, defs)
        return {**target, **extra}
    out: Schema = {}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1 or len(branches) == len(node["anyOf"]):
            raise ValueError(f"unsupported union in the API models: {node['anyOf']}")
        out.update(_convert(branches[0], defs))
        out["nullable"] = True
    for key, value in node.items():
        if key in ("anyOf", "title", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _convert(child, defs) for name, child in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _convert(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020 numbers -> OpenAPI v3.0 boolean flags on minimum/maximum.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default":
            if value is not None:
                out[key] = value
        else:
            out[key] = value
    return out


def _model_schema(model: Any) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _val(path: str, default: str) -> str:
    """CEL for a spec field that may be absent (its parents may be unset), with its default."""
    parts = path.split(".")
    guards = " && ".join(f"has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))
    return f"(({guards}) ? self.{path} : {default})"


def _set(path: str) -> str:
    parts = path.split(".")
    return " && ".join(f"has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))


def cel_rules() -> list[Schema]:
    """The planner's static cross-field rules as CEL on spec; messages are the planner's."""
    runtime = _val("runtime.type", "'builtin'")
    tier = _val("gpu.tier", "'h100'")
    pipeline = _val("pipeline", "'speech'")
    thinker_tp = _val("stages.thinker.tensorParallelSize", "1")
    vision_tp = _val("stages.imageEncoder.tensorParallelSize", "1")
    placement = _val("stages.imageEncoder.placement", "'withThinker'")
    talker_set = _set("stages.talker.enabled")
    pairs = [
        (
            f"{_val('model.source.type', chr(39) + 'image' + chr(39))} != 'tiny' || {runtime} == 'builtin'",
            rules.TINY_NEEDS_BUILTIN,
        ),
        (
            f"{_val('model.source.type', chr(39) + 'image' + chr(39))} != 'tiny'"
            f" || {_val('model.architecture', chr(39) + 'auto' + chr(39))} in"
            f" [{', '.join(repr(a.value) for a in rules.TINY_ARCHITECTURES)}]",
            rules.TINY_FAMILY,
        ),
        (f"{tier} != 'cpu' || {runtime} == 'builtin'", rules.CPU_NEEDS_BUILTIN),
        (f"{tier} != 'cpu' || {thinker_tp} == 1", rules.CPU_THINKER_TP),
        (f"{tier} != 'cpu' || {vision_tp} == 1", rules.CPU_VISION_TP),
        (f"{tier} != 'cpu' || {placement} != 'dedicated'", rules.CPU_VISION_DEDICATED),
        (
            f"!({pipeline} == 'text' && {talker_set} && self.stages.talker.enabled == true)",
            rules.TEXT_WITH_TALKER,
        ),
        (
            f"!({pipeline} != 'text' && {talker_set} && self.stages.talker.enabled == false)",
            rules.SPEECH_WITHOUT_TALKER,
        ),
        (
            f"{runtime} != 'builtin' || !({_set('stages.thinker.quantization')})",
            rules.BUILTIN_NO_QUANTIZATION,
        ),
        (
            f"{runtime} != 'builtin' || {_val('stages.thinker.cpuOffloadGb', '0')} == 0",
            rules.BUILTIN_NO_OFFLOAD,
        ),
        (f"{runtime} == 'builtin' || !({_set('sessionKv.maxMib')})", rules.SESSION_KV_NEEDS_BUILTIN),
        (f"{runtime} != 'vllm-omni' || {placement} != 'dedicated'", rules.VLLM_VISION_DEDICATED),
        (f"{runtime} != 'vllm-omni' || {vision_tp} == 1", rules.VLLM_VISION_TP),
        (f"16 % {vision_tp} == 0", rules.VISION_TP_DIVIDES_HEADS),
        (f"{placement} != 'withThinker' || {vision_tp} <= {thinker_tp}", rules.VISION_TP_LE_THINKER),
    ]
    pairs += _peer_rules(runtime, pipeline)
    return [
        *({"rule": rule, "message": r.message} for rule, r in pairs),
        _stage_images_rule(),
        _node_selector_rule(),
        *(_name_rule(f"gpu.{to_camel(field)}", rule) for field, rule in GPU_NAME_RULES.items()),
        *_env_rules(),
        *_switch_rules(runtime),
    ]


def _keys_rule(path: str, var: str, ok: str, *, summary: str, reason: str, fix: str) -> Schema:
    """Every key of the mapping at spec.`path` passes `ok` (CEL over `var`); the message names the
    first that does not, in the loader's words (an EntryError: `spec.path.KEY: reason; fix`)."""
    mapping, field = f"self.{path}", f"spec.{path}"
    return {
        "rule": f"!({_set(path)}) || {mapping}.all({var}, {ok})",
        "message": f"{field}: {summary}; {fix}",
        "messageExpression": f"{json.dumps(field + '.')} + {mapping}.filter({var}, !({ok}))[0]"
        f" + {json.dumps(f': {reason}; {fix}')}",
    }


def _name_rule(path: str, rule: NameRule) -> Schema:
    """The string at spec.`path`, when set, is the kind of name `rule` says, in the loader's words
    (its field validator's ValueError: `spec.path: reason; fix`)."""
    return {
        "rule": f"!({_set(path)}) || ({rule.cel(f'self.{path}')})",
        "message": f"spec.{path}: {rule.message}",
    }


def _stage_images_rule() -> Schema:
    """spec.runtime.stageImages keyed by stage pod roles only, in the loader's words."""
    roles = "[" + ", ".join(json.dumps(r) for r in STAGE_IMAGE_ROLES) + "]"
    return _keys_rule(
        "runtime.stageImages",
        "r",
        f"r in {roles}",
        summary="every key must be a stage pod role",
        reason=STAGE_IMAGES_REASON,
        fix=STAGE_IMAGES_FIX,
    )


def _node_selector_rule() -> Schema:
    """spec.gpu.nodeSelector keyed by label keys (a schema cannot check a map's keys; its values
    carry their pattern), in the loader's words."""
    return _keys_rule(
        "gpu.nodeSelector",
        "k",
        label_key_cel("k"),
        summary="every key must be a label key",
        reason=LABEL_KEY_REASON,
        fix=LABEL_KEY_FIX,
    )


def _env_rules() -> list[Schema]:
    """spec.runtime.env in the loader's words (api/runtime_env): a name that is no environment
    variable name (the message names it, so it is an expression), and each name the operator sets."""
    env = "self.runtime.env"
    present = _set("runtime.env")
    pattern = json.dumps(runtime_env.NAME_PATTERN)  # a CEL string literal
    out: list[Schema] = [
        _keys_rule(
            "runtime.env",
            "n",
            f"n.matches({pattern})",
            summary=f"every name must match {runtime_env.NAME_PATTERN}",
            reason=runtime_env.BAD_NAME_REASON,
            fix=runtime_env.BAD_NAME_FIX,
        )
    ]
    for name in runtime_env.OPERATOR_ENV:
        words = runtime_env.message(name, runtime_env.reserved_reason(name), runtime_env.RESERVED_FIX)
        out.append({"rule": f"!({present} && '{name}' in {env})", "message": words})
    return out


def _switch_rules(runtime: str) -> list[Schema]:
    """The builtin runtime's switches in spec.runtime.env (omni_runtime.contract.switches), with the
    loader's message: the value is named, so each message is an expression. A value switch's rule
    checks its written form; what only its parser knows (buckets in increasing order, say) the
    operator reports in status, and the worker refuses as it starts."""
    env = "self.runtime.env"
    present = _set("runtime.env")
    out: list[Schema] = []
    for switch in switches.SWITCHES:
        value = f"{env}[{json.dumps(switch.name)}]"
        if switch.kind == "flag":
            tail, fix = f"', {switches.NOT_A_FLAG}; ", switches.FLAG_FIX
        elif switch.kind == "value":
            tail, fix = f"', {switch.format}; ", f"use e.g. {switch.example}"
        else:
            tail, fix = "'; ", switches.choice_fix(switch)
        head = f"{runtime_env.FIELD}.{switch.name}: is '"
        out.append(
            {
                "rule": f"{runtime} != 'builtin' || !({present} && {json.dumps(switch.name)} in {env})"
                f" || {value}.matches({json.dumps(switches.pattern(switch))})",
                "message": f"{runtime_env.FIELD}.{switch.name}: {fix}",
                "messageExpression": f"{json.dumps(head)} + {value} + {json.dumps(tail + fix)}",
            }
        )
    return out


def _peer_rules(runtime: str, pipeline: str) -> list[tuple[str, rules.Rule]]:
    """Versions, families and variants of the peer runtimes' support tables (explicit architectures)."""
    architecture = _val("model.architecture", "'auto'")
    version_set = _set("runtime.version")
    pairs = [(f"{runtime} != 'builtin' || !({version_set})", rules.BUILTIN_NO_VERSION)]
    for peer, versions in PEER_VERSIONS.items():
        listed = ", ".join(f"'{v}'" for v in versions)
        pairs.append(
            (
                f"{runtime} != '{peer.value}' || !({version_set}) || self.runtime.version in [{listed}]",
                rules.version_rule(peer),
            )
        )
    for peer, version, family, variant, rule in rules.peer_refusals():
        release = _val("runtime.version", f"'{PEER_VERSIONS[peer][-1]}'")
        when = (
            f"{runtime} == '{peer.value}' && {release} == '{version}' && {architecture} == '{family.value}'"
        )
        if variant is not None:
            when += f" && {pipeline} == '{variant.value}'"
        pairs.append((f"!({when})", rule))
    for version, families in SGLANG_OMNI.items():
        release = _val("runtime.version", f"'{PEER_VERSIONS[RuntimeType.sglang_omni][-1]}'")
        for family, info in families.items():
            if info.vision_tp:
                continue
            when = (
                f"{runtime} == 'sglang-omni' && {release} == '{version}' && {architecture} == '{family.value}'"
                f" && ({_val('stages.imageEncoder.placement', chr(39) + 'withThinker' + chr(39))} == 'dedicated'"
                f" || {_val('stages.imageEncoder.tensorParallelSize', '1')} != 1)"
            )
            pairs.append((f"!({when})", rules.sglang_vision_rule(version, family)))
    return pairs


def openapi_schema() -> Schema:
    spec = _model_schema(OmniDeploymentSpec)
    spec["x-kubernetes-validations"] = cel_rules()
    status = _model_schema(OmniDeploymentStatus)
    return {
        "type": "object",
        "description": "An omni model deployment: complete workers of stage pods behind one session router.",
        "required": ["spec"],
        # Worker, pod and Service names are built from the name; the loader says the same words.
        "x-kubernetes-validations": [
            {"rule": "self.metadata.name.size() <= 40", "message": NAME_TOO_LONG},
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd_manifest() -> Schema:
    columns = [
        {"name": "Workers", "type": "integer", "jsonPath": ".spec.workers"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.workers.ready"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `omni crd` from operator/omni_operator/api; do not edit by hand.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="omni crd", description="Write or print the generated OmniDeployment CRD."
    )
    parser.add_argument(
        "-o", "--output-dir", help=f"Write {CRD_FILE} into this directory (default: print it)."
    )
    parser.add_argument(
        "--check", action="store_true", help="Exit 1 when the CRD in the directory (default crds/) is stale."
    )
    args = parser.parse_args(argv)
    text = crd_yaml()
    if args.check:
        path = Path(args.output_dir or "crds") / CRD_FILE
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != text:
            state = "missing" if current is None else "stale"
            print(
                f"omni crd: {path} is {state}; regenerate it with `omni crd -o {path.parent}`",
                file=sys.stderr,
            )
            return 1
        print(f"{path} is up to date")
        return 0
    if args.output_dir is None:
        sys.stdout.write(text)
        return 0
    out_dir = Path(args.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / CRD_FILE).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"omni crd: error: cannot write {out_dir / CRD_FILE}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {out_dir / CRD_FILE}")
    return 0
