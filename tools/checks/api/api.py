#!/usr/bin/env python3
"""The public API of each library product, recorded at a release and checked on every build.

Each product's API is read from the debug build with swift-symbolgraph-extract (public symbols
only) and written as sorted lines, one per declaration and one per conformance:

    AccessoryManager.startUSB(options:)  func startUSB(options: USBOptions = USBOptions()) throws(USBError)
    USBID : Hashable

`docs/api/PRODUCT.api` holds those lines as they were at the release named on its first
line. The check (the default) fails when a recorded line is gone from the build: a declaration
removed, renamed or changed (its signature, its throws, its defaults) or a conformance dropped,
any of which can break a user's code. Lines the build has and the baseline lacks are additions:
reported, and they pass.

A break that is meant: run `python3 tools/checks/api/api.py --write` and say what users must
change in CHANGELOG.md (under Unreleased, a "### Upgrading" section). A baseline written after
a release is marked as such, and the check then insists that section exists; cutting a release
(the Unreleased section becoming a version) rewrites the mark with `--write`.

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


def run(arguments, **options):
    return subprocess.run(arguments, cwd=ROOT, check=True, capture_output=True, text=True, **options).stdout


def manifest():
    return json.loads(run(["swift", "package", "dump-package"]))


def products(package):
    return sorted({target for product in package["products"] if "library" in product["type"] for target in product["targets"]})


def include_flags(package):
    """-I for every C system library's module map, and what pkg-config says their headers need."""
    flags = []
    for target in package["targets"]:
        if target["type"] != "system":
            continue
        flags += ["-I", str(ROOT / (target.get("path") or f"Sources/{target['name']}"))]
        if target.get("pkgConfig"):
            try:
                for flag in run(["pkg-config", "--cflags-only-I", target["pkgConfig"]]).split():
                    flags += ["-Xcc", flag]
            except (subprocess.CalledProcessError, FileNotFoundError):
                pass
    return flags


def symbol_lines(module, modules_dir, flags):
    """The module's public API as sorted lines."""
    with tempfile.TemporaryDirectory() as scratch:
        tool = shutil.which("swift-symbolgraph-extract") or str(pathlib.Path(shutil.which("swift")).parent / "swift-symbolgraph-extract")
        run([tool, "-module-name", module, "-I", str(modules_dir), "-target", "x86_64-unknown-linux-gnu",
             "-minimum-access-level", "public", "-skip-synthesized-members", "-output-dir", scratch] + flags)
        graphs = sorted(pathlib.Path(scratch).glob("*.symbols.json"))
        symbols, lines = {}, set()
        loaded = [json.loads(graph.read_text()) for graph in graphs]
        for graph in loaded:
            for symbol in graph["symbols"]:
                symbols[symbol["identifier"]["precise"]] = ".".join(symbol["pathComponents"])
        for graph in loaded:
            for symbol in graph["symbols"]:
                declaration = "".join(fragment["spelling"] for fragment in symbol.get("declarationFragments", []))
                declaration = re.sub(r"\s+", " ", declaration).strip()
                lines.add(f"{'.'.join(symbol['pathComponents'])}  {declaration}")
            for relation in graph["relationships"]:
                if relation["kind"] != "conformsTo" or relation["source"] not in symbols:
                    continue
                target = symbols.get(relation["target"]) or relation.get("targetFallback") or relation["target"]
                lines.add(f"{symbols[relation['source']]} : {target}")
        return sorted(lines)


def unreleased_has_upgrading():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    match = re.search(r"^## \[?Unreleased\]?.*?$(.*?)(?=^## )", changelog, re.M | re.S)
    return bool(match and re.search(r"^### Upgrading", match.group(1), re.M))


def latest_release():
    match = re.search(r"^## \[?(\d+\.\d+\.\d+)\]?", (ROOT / "CHANGELOG.md").read_text(), re.M)
    return match.group(1) if match else "none"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the build's API as the baseline")
    arguments = parser.parse_args()
    package = manifest()
    modules_dir = pathlib.Path(run(["swift", "build", "--show-bin-path"]).strip()) / "Modules"
    if not modules_dir.is_dir():
        print(f"api: no built modules in {modules_dir}: run `swift build` first", file=sys.stderr)
        return 2
    flags = include_flags(package)
    release = latest_release()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    unreleased = re.search(r"^## \[?Unreleased\]?(.*?)(?=^## )", changelog, re.M | re.S)
    # Unreleased counts once it lists a change (a bullet), not for its empty headings.
    after_release = bool(unreleased and re.search(r"^- ", unreleased.group(1), re.M))
    marked_after_release = []
    broken, added, checked = 0, 0, 0
    for module in products(package):
        lines = symbol_lines(module, modules_dir, flags)
        baseline = BASELINES / f"{module}.api"
        if arguments.write:
            mark = f"# {module}: the public API at {release}" + (", with the changes of Unreleased in CHANGELOG.md" if after_release else "")
            baseline.write_text(mark + "\n" + "".join(line + "\n" for line in lines))
            continue
        if not baseline.exists():
            print(f"api: {module} has no baseline ({baseline.relative_to(ROOT)}): record it with "
                  "`python3 tools/checks/api/api.py --write`", file=sys.stderr)
            broken += 1
            continue
        recorded = baseline.read_text().splitlines()
        mark, recorded = recorded[0], {line for line in recorded[1:] if line}
        if "with the changes of Unreleased" in mark:
            marked_after_release.append(module)
        gone = sorted(recorded - set(lines))
        new = sorted(set(lines) - recorded)
        checked += len(recorded)
        for line in gone:
            print(f"api: {module}: gone or changed since the baseline: {line}", file=sys.stderr)
        broken += len(gone)
        added += len(new)
    if marked_after_release and not unreleased_has_upgrading():
        print(f"api: the baselines of {', '.join(marked_after_release)} record changes made after {release}, and CHANGELOG.md's "
              "Unreleased section has no \"### Upgrading\" part saying what users must change", file=sys.stderr)
        broken += 1
    if arguments.write:
        print(f"api: recorded the public API of {len(products(package))} products in {BASELINES.relative_to(ROOT)} (release {release}"
              + (", with Unreleased changes: say them in CHANGELOG.md under ### Upgrading)" if after_release else ")"))
        return 0
    if broken:
        print(f"api: {broken} problem(s). A change that breaks users fails here unless it is meant: then record the new API "
              "(`python3 tools/checks/api/api.py --write`) and say what users must change in CHANGELOG.md, "
              "Unreleased, \"### Upgrading\"", file=sys.stderr)
        return 1
    print(f"api: {checked} recorded declarations and conformances of {len(products(package))} products are all still there"
          + (f"; {added} added since (additions break nobody)" if added else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
