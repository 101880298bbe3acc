"""diff_children: exact create/update/replace/delete sets, and nothing at all when idle."""

from __future__ import annotations

from omni_operator.reconcile.diff import APPLIED_HASH, ChildDiff, diff_children, manifest_hash, stamped
from omni_operator.reconcile.observe import ChildKey


def svc(name: str, port: int = 8000) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"port": port}]},
    }


def pod(name: str, image: str = "img:1") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"image": image}]},
    }


def as_stored(manifest: dict, **extra_status: object) -> dict:
    """What the API server returns after an apply: the stamp plus server-side fields."""
    out = stamped(manifest)
    out["metadata"]["uid"] = "server-uid"
    out["status"] = dict(extra_status)
    if out["kind"] == "Service":
        out["spec"]["clusterIP"] = "10.96.0.7"
    return out


def test_hash_ignores_its_own_annotation_and_key_order() -> None:
    a = svc("a")
    b = {
        "spec": {"ports": [{"port": 8000}]},
        "metadata": {"name": "a"},
        "kind": "Service",
        "apiVersion": "v1",
    }
    assert manifest_hash(a) == manifest_hash(b) == manifest_hash(stamped(a))
    assert stamped(a)["metadata"]["annotations"] == {APPLIED_HASH: manifest_hash(a)}
    assert "annotations" not in a["metadata"]  # stamping copies
    assert manifest_hash(svc("a", 8001)) != manifest_hash(a)


def test_everything_missing_is_created() -> None:
    diff = diff_children(desired=[svc("a"), pod("p")], observed=[])
    assert diff == ChildDiff(create=(stamped(svc("a")), stamped(pod("p"))))
    assert diff.writes == 2


def test_idle_reconcile_writes_nothing() -> None:
    desired = [svc("a"), pod("p")]
    observed = [as_stored(m, phase="Running") for m in desired]
    diff = diff_children(desired=desired, observed=observed)
    assert diff == ChildDiff()
    assert diff.empty


def test_changed_service_is_patched_changed_pod_is_replaced() -> None:
    observed = [as_stored(svc("a")), as_stored(pod("p"))]
    diff = diff_children(desired=[svc("a", 9000), pod("p", "img:2")], observed=observed)
    assert diff == ChildDiff(update=(stamped(svc("a", 9000)),), replace=(ChildKey("v1", "Pod", "p"),))


def test_leftovers_are_deleted_terminating_ones_are_awaited() -> None:
    old = as_stored(pod("p"))
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    observed = [old, as_stored(svc("gone")), as_stored(pod("extra"))]
    diff = diff_children(desired=[pod("p")], observed=observed)
    assert diff == ChildDiff(
        delete=(ChildKey("v1", "Pod", "extra"), ChildKey("v1", "Service", "gone")),
        waiting=(ChildKey("v1", "Pod", "p"),),
    )


def test_forced_recreation_replaces_an_unchanged_pod() -> None:
    diff = diff_children(
        desired=[pod("p"), pod("q")],
        observed=[as_stored(pod("p")), as_stored(pod("q"))],
        recreate=[ChildKey("v1", "Pod", "q")],
    )
    assert diff == ChildDiff(replace=(ChildKey("v1", "Pod", "q"),))


def test_child_applied_by_someone_else_is_taken_over() -> None:
    unstamped = svc("a") | {"status": {}}
    diff = diff_children(desired=[svc("a")], observed=[unstamped])
    assert diff == ChildDiff(update=(stamped(svc("a")),))
