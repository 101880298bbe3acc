"""The embedded default deployment that `omni up` runs with no -f: two tiny-checkpoint workers."""

from __future__ import annotations

DEFAULT_DEPLOYMENT_YAML = """\
apiVersion: omni.dev/v1alpha1
kind: OmniDeployment
metadata:
  name: tiny-omni
spec:
  model:
    name: tiny-omni
    source:
      type: tiny
    architecture: qwen2_5_omni
  runtime:
    type: builtin
  pipeline: speech
  workers: 2
  gpu:
    tier: cpu
"""
