"""The one `omni` command; each subcommand imports its module only when it runs."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("omni: skeleton", file=sys.stderr)
    return 0
