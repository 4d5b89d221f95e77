"""Print the requirements of pyproject.toml's extras, one per line, for ``pip install -r``.

``python scripts/requirements.py dev spark`` prints what ``pip install '.[dev,spark]'``
would install besides tickwheel itself: the project's dependencies and each named
extra's, with the extras that one names in ``tickwheel[...]`` expanded in place.
The Makefile installs them while the compiled core builds (``pip install --no-deps
-e .``): the two take one core each, and one after the other they took twice as long.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(extras: list[str]) -> list[str]:
    """The requirements of the project and of ``extras``, self-references expanded."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    name, optional = project["name"], project.get("optional-dependencies", {})
    self_reference = re.compile(rf"^{re.escape(name)}\[([^\]]+)\]\s*$")
    found: list[str] = list(project.get("dependencies", []))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"requirements.py: pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for requirement in optional[extra]:
            match = self_reference.match(requirement)
            if match:
                pending.extend(part.strip() for part in match.group(1).split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
