"""Pure Plan -> Kubernetes manifests (plain dicts); no API server, no kopf."""

from omni_operator.render.common import Manifest, Owner
from omni_operator.render.manifests import render_manifests, render_worker

__all__ = ["Manifest", "Owner", "render_manifests", "render_worker"]
