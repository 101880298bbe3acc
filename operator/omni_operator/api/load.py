"""Read OmniDeployments from YAML files, turning every problem into one clear message.

A user who mistypes a field should read the file, the camelCase field path, what is wrong and
what to write instead, never a pydantic dump or a traceback. `SpecError` carries exactly that.
"""

from __future__ import annotations

import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from omni_operator.api.kube_rules import (
    EFFECT_FIX,
    LABEL_KEY_FIX,
    LABEL_VALUE_FIX,
    OPERATOR_FIX,
)
from omni_operator.api.runtime_env import EntryError
from omni_operator.api.spec import API_VERSION, KIND, NUL_FIX, NUL_REASON, OmniDeployment


class SpecError(ValueError):
    """A spec that cannot be used: where (file, line, field), why, and how to fix it."""

    def __init__(self, *, file: str, field: str, reason: str, fix: str, line: int | None = None) -> None:
        self.file, self.field, self.reason, self.fix, self.line = file, field, reason, fix, line
        where = f"{file}:{line}" if line is not None else file
        parts = [where, field] if field else [where]
        super().__init__(f"{': '.join(parts)}: {reason}; {fix}")


def load_deployments(path: str | Path) -> list[OmniDeployment]:
    """Every OmniDeployment in a YAML file (documents separated by ---); '-' reads stdin."""
    name = str(path)
    try:
        text = sys.stdin.read() if name == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(file=name, field="", reason="file not found", fix="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            file=name, field="", reason=f"cannot read the file ({exc})", fix="pass a UTF-8 YAML file"
        ) from None
    return parse_deployments(text, file=name)


class DuplicateKey(Exception):
    """A mapping that names one key twice: PyYAML would keep the last value without a word."""

    def __init__(self, *, path: tuple[int | str, ...], line: int, first_line: int) -> None:
        super().__init__(f"{field_path(path)} on line {line} (first on line {first_line})")
        self.path, self.line, self.first_line = path, line, first_line


MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a repeated key in any mapping of a document (DuplicateKey).
    Keys merged in with `<<` may be overridden, as YAML means them to be."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_unique_keys(node)
        return super().construct_document(node)

    def _check_unique_keys(self, root: yaml.Node) -> None:
        """Depth first in document order, without recursion; an alias is walked once."""
        stack: list[tuple[yaml.Node, tuple[int | str, ...]]] = [(root, ())]
        walked: set[int] = set()
        while stack:
            node, path = stack.pop()
            if id(node) in walked:
                continue
            walked.add(id(node))
            children: list[tuple[yaml.Node, tuple[int | str, ...]]] = []
            if isinstance(node, yaml.SequenceNode):
                children = [(item, (*path, i)) for i, item in enumerate(node.value)]
            elif isinstance(node, yaml.MappingNode):
                first: dict[Any, int] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                        children.append((value_node, path))
                        continue
                    key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                    if key in first:
                        raise DuplicateKey(path=(*path, key_node.value), line=line, first_line=first[key])
                    first[key] = line
                    children.append((value_node, (*path, key_node.value)))
            stack.extend(reversed(children))


def parse_deployments(text: str, *, file: str = "<string>") -> list[OmniDeployment]:
    try:
        documents = [d for d in yaml.load_all(text, Loader=UniqueKeyLoader) if d is not None]
    except DuplicateKey as exc:
        raise SpecError(
            file=file,
            field=field_path(exc.path),
            line=exc.line,
            reason=f"duplicate key {exc.path[-1]!r} (first on line {exc.first_line})",
            fix="keep one of them: YAML would silently use the last",
        ) from None
    except RecursionError:
        raise SpecError(
            file=file,
            field="",
            reason="the YAML is nested too deeply to read",
            fix="write the OmniDeployment as a plain mapping (see examples/)",
        ) from None
    except ValueError:
        # PyYAML's int() of a number past Python's digit limit (4300): not a YAMLError.
        raise SpecError(
            file=file,
            field="",
            reason=f"a number in the YAML has more than {sys.get_int_max_str_digits()} digits",
            fix="write every number with fewer digits",
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(
            file=file,
            field="",
            line=line,
            reason=f"malformed YAML: {problem}",
            fix="fix the YAML syntax on that line",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(
            file=file, field="", reason=f"malformed YAML: {exc}", fix="fix the YAML syntax"
        ) from None
    if not documents:
        raise SpecError(
            file=file, field="", reason="no OmniDeployment found", fix="write one (see examples/)"
        )
    many = len(documents) > 1
    return [
        _parse_document(doc, file=f"{file} (document {i + 1})" if many else file)
        for i, doc in enumerate(documents)
    ]


def _parse_document(doc: object, *, file: str) -> OmniDeployment:
    if not isinstance(doc, dict):
        raise SpecError(
            file=file,
            field="",
            reason=f"expected an OmniDeployment mapping, got {_kind_of(doc)}",
            fix="start the document with apiVersion, kind, metadata and spec",
        )
    if doc.get("apiVersion", API_VERSION) != API_VERSION:
        raise SpecError(
            file=file,
            field="apiVersion",
            reason=f"{doc['apiVersion']!r} is not {API_VERSION}",
            fix=f"set apiVersion: {API_VERSION}",
        )
    if doc.get("kind", KIND) != KIND:
        raise SpecError(
            file=file, field="kind", reason=f"{doc['kind']!r} is not {KIND}", fix=f"set kind: {KIND}"
        )
    try:
        return OmniDeployment.model_validate(doc)
    except ValidationError as exc:
        raise _spec_error(exc, file=file) from None


def _kind_of(value: object) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_DNS_LABEL_FIX = "use lowercase letters, digits and '-', starting and ending with a letter or digit"
NAMESPACE_FIX = _DNS_LABEL_FIX + " (at most 63 characters)"  # metadata.namespace and --namespace
_PATTERN_FIXES = {
    "metadata.name": _DNS_LABEL_FIX,
    "metadata.namespace": NAMESPACE_FIX,
}
# By the field's last two path parts: the same kind of field in several places.
_PATTERN_FIXES_BY_TAIL = {
    "resources.cpu": "use a Kubernetes CPU quantity such as '2', '500m' or '1.5'",
    "resources.memory": "use a Kubernetes memory quantity such as '32Gi', '512Mi' or '4G'",
    "source.claimName": "use the PersistentVolumeClaim's name: lowercase letters, digits, '-' and '.'",
    "source.subPath": "use a path inside the volume, relative and without '..' elements, such as 'models/qwen'",
    "auth.secretName": "use the Secret's name: lowercase letters, digits, '-' and '.'",
    "auth.key": "use letters, digits, '-', '_' and '.', not starting with '..'",
    "model.path": "use an absolute path without '..' elements, such as '/models/model'",
    "source.hostPath": "use the node directory's absolute path, without '..' elements, such as '/mnt/models'",
    "tolerations.key": LABEL_KEY_FIX,
    "tolerations.operator": OPERATOR_FIX,
    "tolerations.value": LABEL_VALUE_FIX,
    "tolerations.effect": EFFECT_FIX,
}
# By the mapping a value is an entry of (its key is the user's, any text).
_PATTERN_FIXES_BY_MAP = {"gpu.nodeSelector": LABEL_VALUE_FIX}


def _pattern_fix(loc: tuple[int | str, ...]) -> str:
    names = [str(part) for part in loc if not isinstance(part, int)]
    return (
        _PATTERN_FIXES.get(".".join(names))
        or _PATTERN_FIXES_BY_TAIL.get(".".join(names[-2:]))
        or _PATTERN_FIXES_BY_MAP.get(".".join(names[-3:-1]))
        or "use a value matching that pattern"
    )


_TYPE_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
    "dict": "a mapping",
    "model": "a mapping",
    "list": "a list",
    "tuple": "a list",
}


def _spec_error(exc: ValidationError, *, file: str) -> SpecError:
    """The first problem pydantic found, in the user's words (camelCase path, reason, fix)."""
    err = exc.errors()[0]
    loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx", {})
    field, given = field_path(loc), err.get("input")
    shown = _shown(given)
    more = exc.error_count() - 1
    suffix = f" ({more} more problem{'s' if more > 1 else ''} after this one)" if more else ""

    def error(reason: str, fix: str, where: str = field) -> SpecError:
        return SpecError(file=file, field=where, reason=reason, fix=fix + suffix)

    if loc and loc[-1] == "[key]" and len(loc) >= 2:
        # A mapping's key of the wrong type: YAML reads an unquoted 1 or true as a number or a
        # boolean. Name the key as the user wrote it, not pydantic's "[1].[key]".
        where = f"{field_path(loc[:-2])}.{loc[-2]}"
        text = str(given).lower() if isinstance(given, bool) else given
        return error(f"the name {given!r} is not a string", f"quote it: '{text}'", where=where)
    if kind == "finite_number":
        return error(f"{shown} is not a finite number", "use a finite number")
    if kind == "missing":
        return error("required field is missing", f"add {loc[-1]}")
    if kind == "extra_forbidden":
        parent = field_path(loc[:-1])
        valid = _valid_fields(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {close[0]}? " if close else "remove it; "
        return error(
            f"unknown field {loc[-1]!r}", f"{hint}fields of {parent or 'the object'}: {', '.join(valid)}"
        )
    if kind == "enum":
        return error(f"{shown} is not a valid {loc[-1]}", f"use one of {ctx['expected']}")
    if kind == "value_error" and isinstance(ctx.get("error"), EntryError):
        entry = ctx["error"]
        return error(entry.reason, entry.fix, where=f"{field}.{entry.entry}")
    if kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
        reason, _, fix = message.partition("; ")
        return error(reason, fix or "correct the value")
    bounds = {
        "greater_than_equal": ("below the minimum", "ge", ">="),
        "greater_than": ("not above the bound", "gt", ">"),
        "less_than_equal": ("above the maximum", "le", "<="),
        "less_than": ("not below the bound", "lt", "<"),
    }
    if kind in bounds:
        words, key, op = bounds[kind]
        return error(f"{shown} is {words} {ctx[key]}", f"use a value {op} {ctx[key]}")
    if kind == "string_too_short":
        return error(f"must have at least {ctx['min_length']} character(s)", "set a non-empty value")
    if kind == "too_long":  # a list's items or a mapping's entries
        noun = "items" if ctx.get("field_type") == "List" else "entries"
        count = ctx.get("actual_length")  # None for a mapping: pydantic stops counting at the bound
        count = len(given) if count is None and isinstance(given, list | dict) else count
        return error(
            f"has {count} {noun}, more than {ctx['max_length']}", f"keep at most {ctx['max_length']}"
        )
    if kind == "string_too_long":
        return error(
            f"is longer than {ctx['max_length']} characters", f"shorten it to {ctx['max_length']} or fewer"
        )
    if kind == "string_pattern_mismatch" and isinstance(given, str) and "\x00" in given:
        return error(NUL_REASON, NUL_FIX)  # as every other string says it (paths' patterns refuse NUL)
    if kind == "string_pattern_mismatch":
        return error(
            f"{shown} does not match {ctx['pattern']}",
            _pattern_fix(loc),
        )
    if kind == "string_type" and isinstance(given, int | float):
        # YAML reads an unquoted 8 as a number and on, yes or true as a boolean (env values, names):
        # say how to write the string.
        text = str(given).lower() if isinstance(given, bool) else given
        return error(f"expected a string, got {shown}", f"quote it: {loc[-1]}: '{text}'")
    for prefix, words in _TYPE_WORDS.items():
        if kind.startswith(f"{prefix}_"):
            return error(f"expected {words}, got {shown}", f"set {loc[-1] if loc else 'it'} to {words}")
    return error(err["msg"], "correct the value")


def _shown(value: object, limit: int = 40) -> str:
    """A value as the message quotes it: its repr, cut short when long (a 400-digit number)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"a number of more than {limit} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _valid_fields(loc: tuple[int | str, ...]) -> list[str]:
    """camelCase field names of the model at `loc`, for did-you-mean hints."""
    model: Any = OmniDeployment
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        model = _model_of(field.annotation)
        if model is None:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple, dict):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None
