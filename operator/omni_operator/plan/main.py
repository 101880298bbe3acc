"""`omni plan -f FILE [--target local]`: print the placement plan of OmniDeployments as YAML.

Also home of `plan_file`, which `omni render` and `omni up` share: load a file and plan every
document, with placement errors reported against the file like schema errors are.
"""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from omni_operator.api.load import NAMESPACE_FIX, SpecError, load_deployments
from omni_operator.api.spec import DNS_LABEL_PATTERN
from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.types import Plan, PlanError, Target


def plan_file(path: str, *, namespace: str | None = None, target: Target = Target.kubernetes) -> list[Plan]:
    """Plans of every OmniDeployment in `path`; raises SpecError (file, field, reason, fix)."""
    if namespace is not None and not (len(namespace) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, namespace)):
        # model_copy below does not validate: check the flag as metadata.namespace is checked.
        raise SpecError(
            file="--namespace",
            field="",
            reason=f"{namespace!r} is not a namespace name",
            fix=NAMESPACE_FIX,
        )
    plans = []
    for dep in load_deployments(path):
        if namespace:
            dep = dep.model_copy(
                update={"metadata": dep.metadata.model_copy(update={"namespace": namespace})}
            )
        try:
            plans.append(plan_deployment(dep, target=target))
        except PlanError as exc:
            raise SpecError(file=path, field=exc.field, reason=exc.reason, fix=exc.fix) from None
    return plans


def plan_yaml(plans: list[Plan]) -> str:
    return yaml.safe_dump_all([p.model_dump(mode="json") for p in plans], sort_keys=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="omni plan", description="Print the placement plan of an OmniDeployment."
    )
    parser.add_argument("-f", "--filename", required=True, help="OmniDeployment YAML file ('-' for stdin).")
    parser.add_argument("--target", choices=[t.value for t in Target], default=Target.kubernetes.value)
    parser.add_argument("-n", "--namespace", help="Override metadata.namespace.")
    args = parser.parse_args(argv)
    try:
        plans = plan_file(args.filename, namespace=args.namespace, target=Target(args.target))
    except SpecError as exc:
        print(f"omni plan: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(plan_yaml(plans))
    return 0
