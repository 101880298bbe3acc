"""`omni render -f FILE [--namespace NS] [-o yaml|json]`: print manifests like `helm template`."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from omni_operator.api.load import SpecError
from omni_operator.plan.main import plan_file
from omni_operator.render.manifests import render_manifests


class _NoAliases(yaml.SafeDumper):
    """Spell repeated values out: manifests are read by people, not only by parsers."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="omni render",
        description="Print the Kubernetes manifests of OmniDeployments (like helm template).",
    )
    parser.add_argument("-f", "--filename", required=True, help="OmniDeployment YAML file ('-' for stdin).")
    parser.add_argument("-n", "--namespace", help="Override metadata.namespace.")
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    args = parser.parse_args(argv)
    try:
        plans = plan_file(args.filename, namespace=args.namespace)
    except SpecError as exc:
        print(f"omni render: error: {exc}", file=sys.stderr)
        return 2
    manifests = [m for plan in plans for m in render_manifests(plan)]
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": manifests}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.dump_all(manifests, Dumper=_NoAliases, sort_keys=False, explicit_start=True))
    return 0
