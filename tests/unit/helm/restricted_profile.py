"""The Pod Security Standards "restricted" profile as a pure check over pod specs.

Used by the chart tests (the operator pod) and the renderer tests (stage pods, router). It follows
the published profile (baseline controls plus the restricted ones) for the fields this project can
produce; the e2e test sends the same pods to a real API server whose PodSecurity admission enforces
`restricted`, so this checker and the real one are held to the same answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Manifest = dict[str, Any]

ALLOWED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def pod_specs(manifest: Manifest) -> Iterator[tuple[str, Manifest]]:
    """(where, pod spec) for a Pod or the pod template of a workload object."""
    kind = manifest.get("kind")
    name = f"{kind}/{manifest.get('metadata', {}).get('name')}"
    if kind == "Pod":
        yield name, manifest["spec"]
    elif kind in POD_TEMPLATE_KINDS:
        yield name, manifest["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield name, manifest["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def _containers(spec: Manifest) -> Iterator[tuple[str, Manifest]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(field) or []):
            yield f"{field}[{i}] ({container.get('name')})", container


def restricted_violations(spec: Manifest) -> list[str]:
    """Every way `spec` (a PodSpec) breaks the restricted profile; empty when it complies."""
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field} must be unset or false")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        bad = kinds - ALLOWED_VOLUME_TYPES
        if bad:
            out.append(f"volume {volume.get('name')!r} uses {', '.join(sorted(bad))}, not allowed")
    if pod_sc.get("runAsUser") == 0:
        out.append("securityContext.runAsUser must not be 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ALLOWED_SECCOMP:
        out.append(f"securityContext.seccompProfile.type {pod_seccomp} is not allowed")
    for sysctl in pod_sc.get("sysctls") or []:
        out.append(f"securityContext.sysctls {sysctl.get('name')} is not allowed by this check")
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}: privileged must be unset or false")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: securityContext.allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: securityContext.capabilities.drop must include ALL")
        added = set(caps.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
        if added:
            out.append(f"{where}: securityContext.capabilities.add {sorted(added)} is not allowed")
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            out.append(f"{where}: runAsNonRoot must be true (container or pod securityContext)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: securityContext.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ALLOWED_SECCOMP:
            out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (container or pod)")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{where}: securityContext.procMount must be Default")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}: hostPort {port['hostPort']} is not allowed")
    return out
