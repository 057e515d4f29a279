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
# A declaration with public or open access (attributes before it allowed); not `public(set)`
# alone, which cannot occur without `public` before it anyway.
DECLARATION = re.compile(r"^\s*(?:@[\w.]+(?:\([^)]*\))?\s+)*(?:public|open)\s")
IMPORT = re.compile(r"^\s*(@_exported\s+)?(public\s+)?import\s+(\w+)")


def main() -> int:
    manifest = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=ROOT, check=True,
                                         capture_output=True, text=True).stdout)
    products = {target for product in manifest["products"] if "library" in product["type"]
                for target in product["targets"]}
    modules = {}
    for target in manifest["targets"]:
        if target["type"] != "regular":
            continue
        path = target.get("path") or f"Sources/{target['name']}"
        if path.startswith("Sources/"):  # not the test support under Tests/
            modules[target["name"]] = ROOT / path
    failures = []
    for name, folder in sorted(modules.items()):
        for file in sorted(folder.rglob("*.swift")):
            for number, line in enumerate(file.read_text().splitlines(), 1):
                if line.lstrip().startswith("//"):
                    continue
                where = f"{file.relative_to(ROOT)}:{number}"
                if name not in products and DECLARATION.match(line):
                    failures.append(f"{where}: `{line.strip()}`: {name} is no product; declare it `package` (or internal)")
                imported = IMPORT.match(line)
                if name in products and imported and (imported.group(1) or imported.group(2)) \
                        and imported.group(3) in modules and imported.group(3) not in products:
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
          "declare nothing public, and no product re-exports one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
