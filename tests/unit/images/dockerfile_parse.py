"""A small Dockerfile reader for the image tests: instructions, grouped into build stages.

No Docker engine runs here, so the images are checked from their source: continuation lines are
joined, comments dropped, and each stage (from one FROM to the next) keeps its instructions.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper-case: FROM, RUN, COPY, ...
    args: str  # the rest of the line, continuation lines joined

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (ENTRYPOINT/CMD/HEALTHCHECK CMD), else None."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text.split(" CMD ", 1)[1] if " CMD " in f" {text}" else ""
            text = text.strip()
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, list) else None


@dataclass
class Stage:
    base: str  # the image after FROM (flags dropped)
    name: str | None
    from_arg: str | None = None  # the build argument FROM names, if any (base is its default)
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs of this stage (later ones win)."""
        out: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for token in shlex.split(instruction.args):
                key, _, value = token.partition("=")
                out[key] = value
        return out


@dataclass
class Dockerfile:
    path: Path
    args_before_from: list[Instruction]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comments inside a continued instruction are dropped by Docker too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), " ".join(args.split())))
    return out


def arg_defaults(args: list[Instruction]) -> dict[str, str]:
    """name -> default of the ARGs before the first FROM (an ARG without a default maps to "")."""
    return {i.args.partition("=")[0]: i.args.partition("=")[2] for i in args if i.keyword == "ARG"}


def parse(path: Path) -> Dockerfile:
    """The stages of PATH; a FROM naming ${ARG} or $ARG gets that ARG's default, as a build without
    --build-arg would (the raw text stays in Stage.from_arg)."""
    before: list[Instruction] = []
    stages: list[Stage] = []
    for instruction in instructions(path.read_text()):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            base, from_arg = words[0], None
            if base.startswith("$"):
                from_arg = base.strip("${}")
                base = arg_defaults(before).get(from_arg, base)
            stages.append(Stage(base=base, name=name, from_arg=from_arg))
        elif stages:
            stages[-1].instructions.append(instruction)
        else:
            before.append(instruction)
    return Dockerfile(path=path, args_before_from=before, stages=stages)
