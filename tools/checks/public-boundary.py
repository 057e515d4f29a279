#!/usr/bin/env python3
"""The API boundary: the library products of Package.swift are the API, and nothing else is.

Fails (exit 1, naming file and line) when
- a module that is not a product declares anything `public` or `open` (it uses `package`
  access for what the products and the tools share), or
- a product imports a module that is not a product with `public import` or `@_exported`
  (its API would then carry that module's types).

Run from anywhere: python3 tools/checks/public-boundary.py. tools/test.sh runs it.
"""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Attributes (with arguments, parentheses nested once) and modifiers that may come before the
# access level of a declaration.
ATTRIBUTES = r"(?:@[\w.]+(?:\((?:[^()]|\([^()]*\))*\))?\s+)*"
MODIFIERS = (r"(?:(?:final|static|class|nonisolated|override|mutating|nonmutating|convenience|required|indirect|lazy|"
             r"dynamic|weak|unowned|optional|distributed|(?:internal|private|fileprivate|package)\(set\))\s+)*")
# A declaration with public or open access; also after the `)` that closes an attribute spread
# over several lines. `public(set)` alone is no access of its own, and is caught with its `public`.
DECLARATION = re.compile(r"^\s*(?:[^()]*\)\s*)?" + ATTRIBUTES + MODIFIERS + r"(?:public|open)\s")
# An import: its attributes (`@_exported`, `@preconcurrency`…), access level, kind and module.
IMPORT = re.compile(r"^\s*(" + ATTRIBUTES + r")(?:(public|package|internal|fileprivate|private)\s+)?import\s+"
                    r"(?:(?:struct|class|enum|protocol|typealias|func|var|let)\s+)?(\w+)")


def code_lines(text):
    """The lines of a Swift file with comments and string literals blanked (so neither a
    commented-out declaration nor a word in a string counts), numbered from 1."""
    out, in_block, in_multiline = [], 0, False
    for line in text.splitlines():
        result, i = [], 0
        while i < len(line):
            if in_block:
                if line.startswith("*/", i):
                    in_block -= 1
                    i += 2
                elif line.startswith("/*", i):
                    in_block += 1
                    i += 2
                else:
                    i += 1
            elif in_multiline:
                if line.startswith('"""', i):
                    in_multiline = False
                    i += 3
                else:
                    i += 1
            elif line.startswith("//", i):
                break
            elif line.startswith("/*", i):
                in_block += 1
                i += 2
            elif line.startswith('"""', i):
                in_multiline = True
                i += 3
            elif line[i] == '"':
                i += 1
                while i < len(line) and line[i] != '"':
                    i += 2 if line[i] == "\\" else 1
                i += 1
                result.append('""')
            else:
                result.append(line[i])
                i += 1
        out.append("".join(result))
    return out


def main() -> int:
    try:
        dumped = subprocess.run(["swift", "package", "dump-package"], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        print("public-boundary: no `swift` on PATH: install the Swift toolchain", file=sys.stderr)
        return 2
    if dumped.returncode != 0:
        print(f"public-boundary: swift package dump-package failed:\n{dumped.stderr.strip()}", file=sys.stderr)
        return 2
    manifest = json.loads(dumped.stdout)
    products = {target for product in manifest["products"] if "library" in product["type"]
                for target in product["targets"]}
    modules, system_libraries = {}, set()
    for target in manifest["targets"]:
        if target["type"] == "system":
            system_libraries.add(target["name"])
        if target["type"] != "regular":
            continue
        path = target.get("path") or f"Sources/{target['name']}"
        if path.startswith("Sources/"):  # not the test support under Tests/
            modules[target["name"]] = ROOT / path
    inner = (set(modules) | system_libraries) - products
    failures = []
    for name, folder in sorted(modules.items()):
        for file in sorted(folder.rglob("*.swift")):
            for number, line in enumerate(code_lines(file.read_text(encoding="utf-8")), 1):
                where = f"{file.relative_to(ROOT)}:{number}"
                if name not in products and DECLARATION.match(line):
                    failures.append(f"{where}: `{line.strip()}`: {name} is no product; declare it `package` (or internal)")
                imported = IMPORT.match(line)
                if name in products and imported and imported.group(3) in inner \
                        and ("@_exported" in imported.group(1) or imported.group(2) == "public"):
                    failures.append(f"{where}: `{line.strip()}`: the product {name} must not re-export {imported.group(3)}, "
                                    f"which is no product; import it `package` and show what the API needs in {name}'s own types")
    for failure in failures:
        print(f"public-boundary: {failure}", file=sys.stderr)
    if failures:
        print(f"public-boundary: {len(failures)} problem(s): the library products ({', '.join(sorted(products))}) are the API; "
              "everything else is package access", file=sys.stderr)
        return 1
    others = sorted(set(modules) - products)
    print(f"public-boundary: {len(products)} products are the API; the {len(others)} modules that are no product "
          "declare nothing public, and no product re-exports a module that is no product")
    return 0


if __name__ == "__main__":
    sys.exit(main())
