"""Desired vs observed children: which to create, patch, replace or delete.

Every applied manifest carries a hash of itself (annotation APPLIED_HASH). A child whose observed
hash equals the desired one is left alone, so an idle reconcile sends no write at all, and server
defaults (clusterIP, pod status, ...) never look like drift. A changed hash means a server-side apply
(patch), except for kinds whose spec cannot change in place (Pod): those are deleted and created again
on a later pass, once the old object is gone.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from omni_operator.api import labels
from omni_operator.reconcile.observe import ChildKey, Manifest, is_terminating, key_of

APPLIED_HASH = f"{labels.PREFIX}/applied-hash"
"""Annotation: hash of the manifest the operator last applied to this child."""

IMMUTABLE_KINDS = frozenset({"Pod"})


def manifest_hash(manifest: Manifest) -> str:
    body = copy.deepcopy(manifest)
    meta = body.get("metadata", {})
    if APPLIED_HASH in (meta.get("annotations") or {}):
        del meta["annotations"][APPLIED_HASH]
        if not meta["annotations"]:
            del meta["annotations"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stamped(manifest: Manifest) -> Manifest:
    """A copy of `manifest` with its own hash in the APPLIED_HASH annotation."""
    out = copy.deepcopy(manifest)
    out.setdefault("metadata", {}).setdefault("annotations", {})[APPLIED_HASH] = manifest_hash(manifest)
    return out


def applied_hash(obj: Manifest) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH)


@dataclass(frozen=True)
class ChildDiff:
    create: tuple[Manifest, ...] = ()
    """Missing children, stamped, to apply."""
    update: tuple[Manifest, ...] = ()
    """Children whose applied hash differs, stamped, to apply (server-side apply patches them)."""
    replace: tuple[ChildKey, ...] = ()
    """Immutable children whose template changed: delete now, created again when gone."""
    delete: tuple[ChildKey, ...] = ()
    """Observed children that are no longer desired."""
    waiting: tuple[ChildKey, ...] = ()
    """Desired children whose previous object is still terminating: created on a later pass."""

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.replace) + len(self.delete)

    @property
    def empty(self) -> bool:
        return self.writes == 0


def diff_children(
    *, desired: Sequence[Manifest], observed: Iterable[Manifest], recreate: Iterable[ChildKey] = ()
) -> ChildDiff:
    """Compare by (apiVersion, kind, name). `recreate` names observed children to replace anyway
    (self-heal: the pods of a worker whose thinker rank failed)."""
    seen = {key_of(o): o for o in observed}
    forced = set(recreate)
    create: list[Manifest] = []
    update: list[Manifest] = []
    replace: list[ChildKey] = []
    waiting: list[ChildKey] = []
    wanted: set[ChildKey] = set()
    for manifest in desired:
        key = key_of(manifest)
        wanted.add(key)
        current = seen.get(key)
        if current is None:
            create.append(stamped(manifest))
        elif is_terminating(current):
            waiting.append(key)
        elif key in forced:
            replace.append(key)
        elif applied_hash(current) != manifest_hash(manifest):
            if key.kind in IMMUTABLE_KINDS:
                replace.append(key)
            else:
                update.append(stamped(manifest))
    delete = [k for k, o in seen.items() if k not in wanted and not is_terminating(o)]
    return ChildDiff(
        create=tuple(create),
        update=tuple(update),
        replace=tuple(replace),
        delete=tuple(sorted(delete)),
        waiting=tuple(waiting),
    )
