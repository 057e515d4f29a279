#!/usr/bin/env python3
"""Documentation checks for the package's library products, over the debug build.

  1. Every public or open declaration of every library product's modules has a doc comment.
     The declarations come from symbol graphs extracted from the built modules
     (swift-symbolgraph-extract, which the toolchain ships: nothing is compiled again).
  2. DocC, the `docc` binary the toolchain ships, converts every one of those modules with no
     warnings: a module with a catalogue (Sources/<Module>/<Module>.docc, found by itself)
     together with its articles, the others from their doc comments alone. Links DocC cannot
     resolve in a one-module build (``OtherModule/Symbol``, or a symbol of another module of
     this package) are let through for modules without a catalogue; in a catalogued module
     every warning fails (write such names as `code` there, not as links).
     `swift package generate-documentation` is not used: it needs the swift-docc-plugin
     package, which this project does not depend on (no external packages).

Run `swift build` first (tools/test.sh has). Exit status: 0 all good; 1 undocumented
declarations or DocC warnings (each is listed); 2 the tools or the build are missing.

What counts as documented:
  - the declaration has a `///` (or `/** */`) comment of its own that starts with a summary
    (not only callouts such as `- Throws:` or `- Parameter:`); or
  - it implements a protocol requirement or overrides a superclass member and has no comment of
    its own: then it inherits the requirement's (or the overridden member's) documentation,
    which is what DocC shows for it (`description` of CustomStringConvertible, `id` of
    Identifiable, a `Transport` requirement implemented by a transport). Those docs must
    exist: an undocumented requirement of this package is reported where it is declared, and
    its implementations with it.
What is not looked at:
  - members the compiler synthesizes (Equatable's `!=` on a type, protocol extension members
    inherited by a conforming type): they have no source here; the extension member they come
    from is checked where it is written when it is ours;
  - extension blocks themselves (their public members are checked one by one);
  - anything declared outside Sources/ (the extractor also reports symbols of other modules).

Usage: tools/checks/docs/check.py [--out DIR] [--no-docc] [--no-symbols-check] [--module M]...
  --module M   check M (a Swift target) instead of the library products' modules; repeatable
  --out DIR    where the symbol graphs and the DocC archives go (default .build/docs)
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def fail(message, status=2):
    print(f"docs: {message}", file=sys.stderr)
    sys.exit(status)


def run(command, **kwargs):
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)


def toolchain_tool(name):
    """A tool of the Swift toolchain: next to `swift` (the one on PATH), or on PATH."""
    swift = shutil.which("swift")
    if swift:
        candidate = Path(os.path.realpath(swift)).parent / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if not found:
        fail(f"the toolchain has no '{name}' (expected beside swift on PATH); install a Swift 6 toolchain from swift.org")
    return found


def package_json(subcommand):
    result = run(["swift", "package", *subcommand])
    if result.returncode != 0:
        fail(f"swift package {' '.join(subcommand)} failed:\n{result.stderr}")
    return json.loads(result.stdout)


def library_modules(description):
    """The Swift modules of the package's library products, in the order products list them."""
    swift_targets = {t["name"] for t in description["targets"] if t.get("module_type") == "SwiftTarget"}
    modules = []
    for product in description["products"]:
        if "library" not in product["type"]:
            continue
        for target in product["targets"]:
            if target in swift_targets and target not in modules:
                modules.append(target)
    return modules


def source_modules(description):
    """Every Swift library module under Sources/ (products or not): the names links may point to."""
    return [t["name"] for t in description["targets"]
            if t.get("module_type") == "SwiftTarget" and t["type"] == "library" and t["path"].startswith("Sources/")]


def clang_flags(description, manifest):
    """-I for each system-library target's module map and the -I its pkg-config names."""
    flags = []
    paths = {t["name"]: t["path"] for t in description["targets"]}
    for target in manifest["targets"]:
        if target["type"] != "system":
            continue
        flags += ["-I", str(ROOT / paths[target["name"]])]
        if target.get("pkgConfig"):
            result = run(["pkg-config", "--cflags-only-I", target["pkgConfig"]])
            if result.returncode != 0:
                fail(f"pkg-config knows no {target['pkgConfig']} (run tools/ensure-deps.sh)")
            for flag in result.stdout.split():
                flags += ["-Xcc", flag]
    return flags


def extract(module, modules_dir, out, triple, flags):
    """Symbol graphs of one module, public and open declarations only, into out/<module>/."""
    directory = out / module
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    command = [toolchain_tool("swift-symbolgraph-extract"), "-module-name", module,
               "-I", str(modules_dir), "-module-cache-path", str(modules_dir.parent / "ModuleCache"),
               "-target", triple, "-minimum-access-level", "public",
               "-emit-extension-block-symbols", "-output-dir", str(directory), *flags]
    result = run(command)
    if result.returncode != 0:
        fail(f"cannot extract the symbols of {module} (is the debug build current? run swift build):\n{result.stderr}")
    return directory


def source_path(uri):
    path = Path(uri.removeprefix("file://"))
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return None


def undocumented(module, directory):
    """(path, line, description) of each undocumented declaration in the module's graphs, and the count looked at."""
    missing, counted = [], 0
    for graph_file in sorted(directory.glob("*.symbols.json")):
        graph = json.loads(graph_file.read_text())
        for symbol in graph["symbols"]:
            precise = symbol["identifier"]["precise"]
            kind = symbol["kind"]["identifier"]
            if kind == "swift.extension" or "::SYNTHESIZED::" in precise:
                continue
            location = symbol.get("location")
            path = source_path(location["uri"]) if location else None
            if path is None or path.parts[0] != "Sources":
                continue
            counted += 1
            comment = symbol.get("docComment")
            text = [line["text"].strip() for line in comment["lines"] if line["text"].strip()] if comment else []
            if text and not text[0].startswith(("- ", "* ")):
                continue  # its own, or inherited from the requirement it implements
            name = ".".join(symbol["pathComponents"])
            line = location["position"]["line"] + 1
            problem = "has a doc comment with no summary (only callouts like - Throws:)" if text else "has no doc comment"
            missing.append((str(path), line, f"{module}: {name} ({symbol['kind']['displayName']}) {problem}"))
    return missing, counted


def catalogue_of(description, module):
    """The module's DocC catalogue (a .docc directory in its target directory), if it has one."""
    paths = {t["name"]: t["path"] for t in description["targets"]}
    found = sorted((ROOT / paths[module]).glob("*.docc"))
    if len(found) > 1:
        fail(f"{module} has {len(found)} DocC catalogues; DocC takes one per module", status=1)
    return found[0] if found else None


def top_level_names(graphs, extensions=True):
    """Module names and the names of top-level symbols, of every module's graphs (with
    `extensions` false, of their own declarations only: not of the types they extend)."""
    names = set(graphs)
    for module, directory in graphs.items():
        for graph_file in directory.glob("*.symbols.json" if extensions else f"{module}.symbols.json"):
            for symbol in json.loads(graph_file.read_text())["symbols"]:
                names.add(symbol["pathComponents"][0])
    return names


def convert(module, catalogue, graphs_dir, out, foreign_names):
    """Converts one module with docc; returns its diagnostics that count, as lines for a person."""
    archive = out / "archives" / f"{module}.doccarchive"
    diagnostics_file = out / "diagnostics" / f"{module}.json"
    shutil.rmtree(archive, ignore_errors=True)
    archive.parent.mkdir(parents=True, exist_ok=True)
    diagnostics_file.parent.mkdir(parents=True, exist_ok=True)
    diagnostics_file.unlink(missing_ok=True)
    command = [toolchain_tool("docc"), "convert", *([str(catalogue)] if catalogue else []),
               "--additional-symbol-graph-dir", str(graphs_dir),
               "--output-path", str(archive),
               "--fallback-display-name", module,
               "--fallback-bundle-identifier", f"AccessoryHost.{module}",
               "--diagnostics-file", str(diagnostics_file)]
    if catalogue:
        command.append("--warnings-as-errors")
    result = run(command)
    if not diagnostics_file.exists():
        return [f"docc convert for {module} wrote no diagnostics (exit {result.returncode}):",
                (result.stdout + result.stderr).strip()]
    counted = []
    for diagnostic in json.loads(diagnostics_file.read_text())["diagnostics"]:
        if diagnostic["severity"] not in ("warning", "error"):
            continue
        summary = diagnostic["summary"]
        if not catalogue and " doesn't exist at " in summary:
            target = summary.split("'")[1]
            if target.split("/")[0].split("(")[0] in foreign_names:
                continue  # a link to another module: DocC cannot resolve it in a one-module build
        place = ""
        if diagnostic.get("source"):
            path = source_path(diagnostic["source"]) or diagnostic["source"]
            place = f"{path}:{diagnostic['range']['start']['line']}: " if diagnostic.get("range") else f"{path}: "
        counted.append(f"{place}{module}: docc {diagnostic['severity']}: {summary}")
    if result.returncode != 0 and not counted:
        counted.append(f"docc convert for {module} failed (exit {result.returncode}): {(result.stdout + result.stderr).strip()}")
    return counted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".build" / "docs"))
    parser.add_argument("--module", action="append", default=[])
    parser.add_argument("--no-docc", action="store_true")
    parser.add_argument("--no-symbols-check", action="store_true")
    arguments = parser.parse_args()

    description = package_json(["describe", "--type", "json"])
    manifest = package_json(["dump-package"])
    modules = arguments.module or library_modules(description)
    bin_path = Path(run(["swift", "build", "--show-bin-path"]).stdout.strip())
    modules_dir = bin_path / "Modules"
    triple = json.loads(run(["swiftc", "-print-target-info"]).stdout)["target"]["triple"]
    flags = clang_flags(description, manifest)
    out = Path(arguments.out)
    graphs_dir = out / "symbol-graphs"

    # Every module of Sources is extracted (a fraction of a second each): the DocC step needs
    # their names to tell a link to another module from a broken one.
    everyone = modules + [m for m in source_modules(description) if m not in modules]
    absent = [m for m in everyone if not (modules_dir / f"{m}.swiftmodule").exists()]
    if absent:
        fail(f"no built module for {', '.join(absent)} in {modules_dir}: run swift build first")
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        graphs = dict(zip(everyone, pool.map(lambda m: extract(m, modules_dir, graphs_dir, triple, flags), everyone)))

    failed = False
    if not arguments.no_symbols_check:
        everything, total = [], 0
        for module in modules:
            missing, counted = undocumented(module, graphs[module])
            everything += missing
            total += counted
            print(f"{module}: {counted - len(missing)} of {counted} public declarations documented")
        for path, line, text in sorted(everything):
            print(f"{path}:{line}: {text}")
        if everything:
            print(f"docs: {len(everything)} of {total} public declarations of {len(modules)} modules have no doc comment "
                  "(say what each is for, its units, errors and threading where they matter)", file=sys.stderr)
            failed = True
        else:
            print(f"docs: all {total} public declarations of {len(modules)} modules are documented")

    if not arguments.no_docc:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            def one(module):
                others = {m: d for m, d in graphs.items() if m != module}
                foreign = top_level_names(others) - top_level_names({module: graphs[module]}, extensions=False)
                return convert(module, catalogue_of(description, module), graphs[module], out, foreign)
            results = dict(zip(modules, pool.map(one, modules)))
        problems = [line for module in modules for line in results[module]]
        for line in problems:
            print(line)
        for module in modules:
            catalogue = catalogue_of(description, module)
            if catalogue and not results[module]:
                archive = out / "archives" / f"{module}.doccarchive"
                shown = archive.relative_to(ROOT) if archive.is_relative_to(ROOT) else archive
                print(f"docs: {catalogue.relative_to(ROOT)} built with no warnings into {shown}")
        if problems:
            print(f"docs: DocC reported {len(problems)} problems in the doc comments or catalogues (above); "
                  "warnings count as failures", file=sys.stderr)
            failed = True
        else:
            print(f"docs: DocC converted {len(modules)} modules with no warnings")

    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
