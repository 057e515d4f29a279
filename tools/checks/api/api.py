#!/usr/bin/env python3
"""The public API of each library product, recorded at a release and checked on every build.

Each product's API is read from the debug build with swift-symbolgraph-extract (public symbols
only) and written as sorted lines, one per declaration, one per conformance and one per module
it re-exports:

    AccessoryManager.startUSB(options:)  func startUSB(options: USBOptions = USBOptions()) throws(USBError)
    USBID : Hashable
    @_exported import AccessoryHost

`docs/api/PRODUCT.api` holds those lines as they were at the release named on its first line.
The check (the default) fails when a recorded line is gone from the build: a declaration
removed, renamed or changed (its signature, its throws, its defaults; even a defaulted parameter
added, which keeps source compatibility but not the signature: record it), a conformance
dropped or a re-export removed. Lines the build has and the record lacks are additions:
reported, and they pass.

A break that is meant: run `python3 tools/checks/api/api.py --write`. A record rewritten with
lines gone since the release it names is marked "changed since", and from then on the check
insists that CHANGELOG.md's Unreleased section has an "### Upgrading" part with at least one
entry saying what users must change. Cutting a release (Unreleased becoming a version) and
`--write` start a clean record of the new release.

Needs a debug build (`swift build`). tools/test.sh runs the check after the build.
"""
import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASELINES = ROOT / "docs" / "api"
CHANGED = "changed since: see CHANGELOG.md, Unreleased, Upgrading"


class Failure(Exception):
    """A tool this check needs failed: the message says which and what to do."""


def run(arguments, what):
    try:
        return subprocess.run(arguments, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise Failure(f"{arguments[0]} is not installed or not on PATH ({what}): install the Swift toolchain")
    except subprocess.CalledProcessError as error:
        raise Failure(f"{what} failed (exit {error.returncode}):\n{error.stderr.strip()}")


def products(package):
    return sorted({target for product in package["products"] if "library" in product["type"] for target in product["targets"]})


def include_flags(package):
    """-I for every C system library's module map, and what pkg-config says their headers need."""
    flags = []
    for target in package["targets"]:
        if target["type"] != "system":
            continue
        flags += ["-I", str(ROOT / (target.get("path") or f"Sources/{target['name']}"))]
        if target.get("pkgConfig") and shutil.which("pkg-config"):
            result = subprocess.run(["pkg-config", "--cflags-only-I", target["pkgConfig"]], capture_output=True, text=True)
            for flag in result.stdout.split() if result.returncode == 0 else []:
                flags += ["-Xcc", flag]
    return flags


def extractor():
    """swift-symbolgraph-extract: on PATH, else beside the real swiftc (a shim's target)."""
    found = shutil.which("swift-symbolgraph-extract")
    if found:
        return found
    swiftc = shutil.which("swiftc")
    if swiftc:
        beside = pathlib.Path(swiftc).resolve().parent / "swift-symbolgraph-extract"
        if beside.exists():
            return str(beside)
    raise Failure("no swift-symbolgraph-extract (it comes with the Swift toolchain): put the toolchain's bin on PATH")


def target_triple():
    info = json.loads(run(["swiftc", "-print-target-info"], "swiftc -print-target-info"))
    return info["target"]["triple"]


def reexports(module, package):
    """The modules `module` re-exports (`@_exported import`), as API lines."""
    target = next(target for target in package["targets"] if target["name"] == module)
    folder = ROOT / (target.get("path") or f"Sources/{module}")
    lines = set()
    for file in folder.rglob("*.swift"):
        for line in file.read_text(encoding="utf-8").splitlines():
            found = re.match(r"^\s*(?:@\w+\s+)*@_exported\s+(?:@\w+\s+)*(?:\w+\s+)?import\s+(\w+)", line)
            if found:
                lines.add(f"@_exported import {found.group(1)}")
    return lines


def symbol_lines(module, package, modules_dir, flags, tool, triple):
    """The module's public API as sorted lines."""
    with tempfile.TemporaryDirectory() as scratch:
        run([tool, "-module-name", module, "-I", str(modules_dir), "-target", triple, "-minimum-access-level", "public",
             "-skip-synthesized-members", "-output-dir", scratch] + flags, f"swift-symbolgraph-extract of {module}")
        loaded = [json.loads(graph.read_text(encoding="utf-8")) for graph in sorted(pathlib.Path(scratch).glob("*.symbols.json"))]
    symbols, lines = {}, reexports(module, package)
    for graph in loaded:
        for symbol in graph["symbols"]:
            symbols[symbol["identifier"]["precise"]] = ".".join(symbol["pathComponents"])
    for graph in loaded:
        for symbol in graph["symbols"]:
            declaration = "".join(fragment["spelling"] for fragment in symbol.get("declarationFragments", []))
            declaration = re.sub(r"\s+", " ", declaration).strip()
            lines.add(f"{'.'.join(symbol['pathComponents'])}  {declaration}")
        for relation in graph["relationships"]:
            if relation["kind"] != "conformsTo":
                continue
            source = symbols.get(relation["source"]) or relation.get("sourceFallback") or relation["source"]
            target = symbols.get(relation["target"]) or relation.get("targetFallback") or relation["target"]
            lines.add(f"{source} : {target}")
    return sorted(lines)


def changelog_sections():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = re.search(r"^## \[?Unreleased\]?[^\n]*\n(.*?)(?=^## |\Z)", changelog, re.M | re.S)
    release = re.search(r"^## \[?(\d+\.\d+\.\d+)\]?", changelog, re.M)
    return (unreleased.group(1) if unreleased else ""), (release.group(1) if release else "none")


def upgrading_notes(unreleased):
    """Whether Unreleased has an "### Upgrading" part with at least one entry."""
    part = re.search(r"^### Upgrading[^\n]*\n(.*?)(?=^### |\Z)", unreleased, re.M | re.S)
    return bool(part and re.search(r"^- ", part.group(1), re.M))


def read_record(path):
    """(release, changed since, lines) of a record, or None when there is none."""
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8").splitlines()
    mark = text[0] if text else ""
    release = re.search(r"the public API at (\S+?)(?:,|$)", mark)
    return (release.group(1) if release else "none"), CHANGED in mark, {line for line in text[1:] if line}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the build's API in docs/api/")
    arguments = parser.parse_args()
    try:
        package = json.loads(run(["swift", "package", "dump-package"], "swift package dump-package"))
        modules_dir = pathlib.Path(run(["swift", "build", "--show-bin-path"], "swift build --show-bin-path").strip()) / "Modules"
        names = products(package)
        missing = [name for name in names if not (modules_dir / f"{name}.swiftmodule").exists()]
        if missing:
            print(f"api: no built module for {', '.join(missing)} in {modules_dir}: run `swift build` first", file=sys.stderr)
            return 2
        flags, tool, triple = include_flags(package), extractor(), target_triple()
        unreleased, release = changelog_sections()
        problems, added, checked, changed_since = 0, 0, 0, []
        for module in names:
            lines = symbol_lines(module, package, modules_dir, flags, tool, triple)
            path = BASELINES / f"{module}.api"
            record = read_record(path)
            if arguments.write:
                changed = bool(record and record[0] == release and (record[1] or record[2] - set(lines)))
                path.write_text(f"# {module}: the public API at {release}" + (f", {CHANGED}" if changed else "") + "\n"
                                + "".join(line + "\n" for line in lines), encoding="utf-8")
                if changed:
                    changed_since.append(module)
                continue
            if record is None:
                print(f"api: {module} has no record ({path.relative_to(ROOT)}): make it with "
                      "`python3 tools/checks/api/api.py --write`", file=sys.stderr)
                problems += 1
                continue
            _, changed, recorded = record
            if changed:
                changed_since.append(module)
            gone = sorted(recorded - set(lines))
            for line in gone:
                print(f"api: {module}: gone or changed since the record: {line}", file=sys.stderr)
            problems += len(gone)
            added += len(set(lines) - recorded)
            checked += len(recorded)
    except Failure as failure:
        print(f"api: {failure}", file=sys.stderr)
        return 2
    if changed_since and not upgrading_notes(unreleased):
        print(f"api: the API of {', '.join(changed_since)} changed since {release} in ways that can break users, and "
              "CHANGELOG.md's Unreleased section has no \"### Upgrading\" part with an entry saying what they must change",
              file=sys.stderr)
        problems += 1
    if arguments.write:
        print(f"api: recorded the public API of {len(names)} products in docs/api (release {release}"
              + (f"; changed since in {', '.join(changed_since)}: say how in CHANGELOG.md, Unreleased, ### Upgrading)" if changed_since else ")"))
        return 1 if problems else 0
    if problems:
        print(f"api: {problems} problem(s). A change that can break users fails here unless it is meant: then record the new "
              "API (`python3 tools/checks/api/api.py --write`) and say what users must change in CHANGELOG.md, Unreleased, "
              "\"### Upgrading\"", file=sys.stderr)
        return 1
    print(f"api: {checked} recorded declarations, conformances and re-exports of {len(names)} products are all still there"
          + (f"; {added} added since (additions break nobody)" if added else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
