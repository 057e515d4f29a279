#!/usr/bin/env python3
"""Lists dependency edges of Package.swift that no source file of the target imports.

Every target's declared dependencies (`swift package dump-package`) are compared with the
modules its Swift files import (`import M`, `public import M`, `@testable import M`,
`@_exported public import M`…). An edge nobody imports makes the build slower and the module
graph in docs/ARCHITECTURE.md wrong; system-library targets (C modules) count when imported.
Exits 1 and prints the edges when there are any.

Usage: tools/checks/unused-dependencies.py   (from anywhere in the repository)
"""
import os
import sys

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402

IMPORT = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?([A-Za-z_][A-Za-z0-9_]*)", re.M)


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    description = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=root, check=True,
                                            capture_output=True, text=True).stdout)
    unused = []
    for target in description["targets"]:
        if target["type"] == "system":
            continue
        path = target.get("path") or os.path.join("Tests" if target["type"] == "test" else "Sources", target["name"])
        imported = set()
        for directory, _, files in os.walk(os.path.join(root, path)):
            for name in files:
                if name.endswith(".swift"):
                    with open(os.path.join(directory, name), encoding="utf-8") as handle:
                        imported.update(IMPORT.findall(handle.read()))
        for dependency in target.get("dependencies", []):
            names = dependency.get("byName") or dependency.get("target") or dependency.get("product") or []
            name = names[0] if names else None
            if name and name not in imported:
                unused.append(f"{target['name']} → {name}")
    for edge in unused:
        print(f"unused dependency: {edge}")
    return 1 if unused else 0


if __name__ == "__main__":
    sys.exit(main())
