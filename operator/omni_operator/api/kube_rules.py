"""Kubernetes' own rules for the spec values that reach a pod unchanged: label keys and values
(spec.gpu.nodeSelector, a toleration's key and value, spec.gpu.topologyKey), a toleration's
operator, effect and their combinations, an extended resource's name (spec.gpu.resourceName), and
absolute paths (spec.model.path, spec.model.source.hostPath).

Without them a bad value passed the loader and the CRD and failed only when the operator created
the pods. The patterns are written for RE2 and Python's re alike (no lookarounds): the API server
checks CRD patterns and CEL `matches` with RE2, pydantic and the loader with theirs. Where a schema
cannot say it (a map's keys, a label key's prefix length, one toleration field depending on
another) the CEL rules here and in crdgen carry the loader's words, so `omni plan` and
`kubectl apply` refuse a value with one message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A DNS-1123 subdomain (lower case, dot-separated labels), unanchored: a label key's prefix, and
# Secret and PersistentVolumeClaim names (spec.DNS_SUBDOMAIN_PATTERN).
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# A label name and a label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^({DNS_SUBDOMAIN}/)?{_LABEL_NAME}$"
# The prefix of a label key holds at most 253 characters (no regex can bound it and check its
# labels at once: the key must match both).
LABEL_PREFIX_LENGTH_PATTERN = r"^([^/]{1,253}/)?[^/]*$"
LABEL_KEY_MAX_LENGTH = 253 + 1 + 63
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
LABEL_VALUE_MAX_LENGTH = 63

LABEL_KEY_REASON = "is not a label key"
LABEL_KEY_FIX = (
    "use a name of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or "
    "digit, after an optional DNS subdomain prefix of at most 253 characters and '/', such as "
    "'nvidia.com/gpu.product'"
)
LABEL_VALUE_FIX = (
    "use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, "
    "or ''; quote it in YAML if it reads as a number or a boolean"
)

# An extended resource's name (spec.gpu.resourceName): a label key whose domain prefix is required,
# such as 'nvidia.com/gpu' (the kubelet counts only domain-qualified extended resources).
RESOURCE_NAME_REASON = "is not a domain-qualified resource name"
RESOURCE_NAME_FIX = (
    "use the device plugin's resource name: a DNS subdomain, '/', and a name of at most 63 letters, "
    "digits, '-', '_' and '.', such as 'nvidia.com/gpu'"
)

# One element of a path: '.', '..x...', '.x...' or 'x...' (never '..'), without NUL characters.
PATH_ELEMENT = r"(\.\.[^/\x00]+|\.[^./\x00][^/\x00]*|\.|[^./\x00][^/\x00]*)"
ABSOLUTE_PATH_PATTERN = rf"^/({PATH_ELEMENT}(/{PATH_ELEMENT})*/?)?$"
PATH_MAX_LENGTH = 4096

OPERATOR_PATTERN = "^(Exists|Equal)$"
EFFECT_PATTERN = "^(NoSchedule|PreferNoSchedule|NoExecute)?$"  # empty: every effect
OPERATOR_FIX = "use Exists or Equal"
EFFECT_FIX = "use NoSchedule, PreferNoSchedule or NoExecute, or '' for every effect"


def is_label_key(key: str) -> bool:
    return bool(re.fullmatch(LABEL_KEY_PATTERN, key) and re.fullmatch(LABEL_PREFIX_LENGTH_PATTERN, key))


def label_key_cel(var: str) -> str:
    """CEL that is true when `var` is a label key (is_label_key)."""
    return f"{var}.matches({json.dumps(LABEL_KEY_PATTERN)}) && {var}.matches({json.dumps(LABEL_PREFIX_LENGTH_PATTERN)})"


def is_resource_name(name: str) -> bool:
    return "/" in name and is_label_key(name)


def resource_name_cel(var: str) -> str:
    """CEL that is true when `var` is a domain-qualified resource name (is_resource_name)."""
    return f"{var}.contains('/') && {label_key_cel(var)}"


@dataclass(frozen=True)
class NameRule:
    """A kind of Kubernetes name a spec string field holds: the loader's check, the CRD's CEL over a
    field expression, and the words both say."""

    check: Callable[[str], bool]
    cel: Callable[[str], str]
    reason: str
    fix: str

    @property
    def message(self) -> str:
        return f"{self.reason}; {self.fix}"


LABEL_KEY_RULE = NameRule(is_label_key, label_key_cel, LABEL_KEY_REASON, LABEL_KEY_FIX)
RESOURCE_NAME_RULE = NameRule(is_resource_name, resource_name_cel, RESOURCE_NAME_REASON, RESOURCE_NAME_FIX)


class TolerationRule:
    """One rule of a toleration's fields together: its CEL (self is the toleration) and the words the
    loader and the API server say (the API server prefixes spec.gpu.tolerations[i])."""

    def __init__(self, *, cel: str, reason: str, fix: str) -> None:
        self.cel, self.reason, self.fix = cel, reason, fix

    @property
    def message(self) -> str:
        return f"{self.reason}; {self.fix}"


TOLERATION_RULES = (
    TolerationRule(
        cel=f"!has(self.key) || self.key == '' || ({label_key_cel('self.key')})",
        reason="key " + LABEL_KEY_REASON,
        fix=LABEL_KEY_FIX,
    ),
    TolerationRule(
        cel="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
        reason="a toleration without a key matches every taint only with operator Exists",
        fix="set key, or set operator: Exists",
    ),
    TolerationRule(
        cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        reason="operator Exists takes no value",
        fix="remove value, or use operator: Equal",
    ),
    TolerationRule(
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        reason="tolerationSeconds applies only to effect NoExecute",
        fix="set effect: NoExecute, or remove tolerationSeconds",
    ),
)


def toleration_problem(toleration: dict[str, Any]) -> TolerationRule | None:
    """The first of TOLERATION_RULES that `toleration` (camelCase, unset fields absent) breaks."""
    key, operator = toleration.get("key") or "", toleration.get("operator")
    broken = (
        bool(key) and not is_label_key(key),
        not key and operator != "Exists",
        operator == "Exists" and bool(toleration.get("value")),
        toleration.get("tolerationSeconds") is not None and toleration.get("effect") != "NoExecute",
    )
    return next((rule for rule, bad in zip(TOLERATION_RULES, broken, strict=True) if bad), None)
