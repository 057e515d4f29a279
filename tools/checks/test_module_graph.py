#!/usr/bin/env python3
"""Tests of module-graph.py on a package and documents made up here (no swift needed): what the
block holds, that it does not depend on the manifest's order, the table's checks, and --check /
--write on a document. Run: python3 tools/checks/test_module_graph.py"""
import contextlib
import importlib.util
import io
import random
import sys
import tempfile
import unittest
from pathlib import Path

sys.dont_write_bytecode = True
_spec = importlib.util.spec_from_file_location("module_graph", Path(__file__).resolve().parent / "module-graph.py")
graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(graph)


def target(name, kind="regular", dependencies=(), path=None, pkg_config=None):
    entry = {"name": name, "type": kind, "dependencies": [{"byName": [d, None]} for d in dependencies]}
    if path:
        entry["path"] = path
    if pkg_config:
        entry["pkgConfig"] = pkg_config
    return entry


def manifest():
    return {
        "products": [
            {"name": "Core", "targets": ["Core"], "type": {"library": ["automatic"]}},
            {"name": "Kit", "targets": ["Kit"], "type": {"library": ["automatic"]}},
            {"name": "tool", "targets": ["tool"], "type": {"executable": None}},
        ],
        "targets": [
            target("CLib", "system", pkg_config="libfoo-1.0"),
            target("CHeader", "system"),
            target("Wire", dependencies=["CHeader"]),
            target("Core", dependencies=["Wire"]),
            target("Kit", dependencies=["Core", "Wire", "Engine"]),
            target("Engine", dependencies=["CLib"]),
            target("tool", "executable", dependencies=["Kit", "Core"], path="tools/tool"),
            target("Helpers", path="Tests/Helpers"),
            target("CoreTests", "test", dependencies=["Core", "Helpers"]),
        ],
    }


TABLE = """| module | what it is | depends on |
|---|---|---|
| `CLib` | a C library | — |
| `CHeader` | a header | — |
| `Wire` | codecs | CHeader |
| `Engine` | the engine | CLib |
| `Core` | the core | Wire |
| `Kit` | everything | Core, Wire, Engine |
| `tools/tool` | the tool | what it needs |
"""


def document(block="stale\n", table=TABLE):
    return f"# Title\n\n{table}\n{graph.BEGIN}\n{block}{graph.END}\n\nAfter.\n"


class RenderTests(unittest.TestCase):
    def test_groups_kinds_and_every_declared_dependency(self):
        block = graph.render(manifest())
        self.assertIn("- `Kit` → `Core`, `Engine`, `Wire`; links `libfoo-1.0`", block)
        self.assertIn("- `Core` → `Wire`; links none", block)
        self.assertIn("- `Engine` → `CLib`; links `libfoo-1.0`", block)
        self.assertIn("- `CLib`: pkg-config `libfoo-1.0`", block)
        self.assertIn("- `CHeader`: a header of the project's own, links nothing", block)
        self.assertIn("- `tool` → `Core`, `Kit`; links `libfoo-1.0`", block)
        products = block.index("Library products")
        internal = block.index("Package-internal modules")
        self.assertLess(products, block.index("- `Core` →"))
        self.assertLess(internal, block.index("- `Engine` →"))
        self.assertLess(block.index("- `Kit` →"), internal)

    def test_tests_and_their_helpers_are_left_out(self):
        block = graph.render(manifest())
        self.assertNotIn("CoreTests", block)
        self.assertNotIn("Helpers", block)

    def test_the_picture_leaves_out_implied_edges_and_shapes_each_kind(self):
        block = graph.render(manifest())
        self.assertIn("    m_Kit --> m_Core", block)
        self.assertNotIn("    m_Kit --> m_Wire", block)  # Kit → Core → Wire
        self.assertNotIn("    m_tool --> m_Core", block)  # tool → Kit → Core
        self.assertIn('    m_Core(["Core"]):::product', block)
        self.assertIn('    m_Engine["Engine"]:::internal', block)
        self.assertIn('    m_CLib[("CLib")]:::system', block)
        self.assertIn('    m_tool{{"tool"}}:::executable', block)
        self.assertIn("(6 of 8 drawn)", block)
        self.assertIn("7 modules (2 library products, 2 package-internal, 2 C system libraries, 1 executable)", block)

    def test_the_manifest_order_changes_nothing(self):
        expected = graph.render(manifest())
        for seed in range(5):
            shuffled = manifest()
            random.Random(seed).shuffle(shuffled["targets"])
            random.Random(seed).shuffle(shuffled["products"])
            for entry in shuffled["targets"]:
                random.Random(seed).shuffle(entry["dependencies"])
            self.assertEqual(graph.render(shuffled), expected)

    def test_a_dependency_outside_the_regular_targets_fails(self):
        broken = manifest()
        broken["targets"][3]["dependencies"].append({"byName": ["Nowhere", None]})
        with self.assertRaises(graph.Failure):
            graph.render(broken)


class TableTests(unittest.TestCase):
    def test_a_right_table_has_no_problems(self):
        self.assertEqual(graph.table_problems(document(), manifest()), [])

    def test_a_wrong_dependency_a_wrong_order_and_a_missing_row_are_reported(self):
        table = (TABLE.replace("| `Core` | the core | Wire |", "| `Core` | the core | Wire, Engine |")
                      .replace("| `CHeader` | a header | — |\n", ""))
        table = table.replace("| `Wire` | codecs | CHeader |\n| `Engine` | the engine | CLib |\n",
                              "| `Engine` | the engine | CLib |\n| `Kit` | everything | Core, Wire, Engine |\n| `Wire` | codecs | CHeader |\n", 1)
        table = table.replace("| `Core` | the core | Wire, Engine |\n| `Kit` | everything | Core, Wire, Engine |\n",
                              "| `Core` | the core | Wire, Engine |\n")
        problems = graph.table_problems(document(table=table), manifest())
        self.assertTrue(any("`Core` depends on Wire (in the row but not declared: Engine)" in p for p in problems), problems)
        self.assertTrue(any("`Kit` is above its dependencies Core, Wire" in p for p in problems), problems)
        self.assertTrue(any("no row for CHeader" in p for p in problems), problems)


class MainTests(unittest.TestCase):
    def run_main(self, text, *arguments):
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory, "ARCHITECTURE.md")
            path.write_text(text)
            saved = graph.DOCUMENT, graph.dump_package
            graph.DOCUMENT, graph.dump_package = path, manifest
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    status = graph.main(list(arguments))
            finally:
                graph.DOCUMENT, graph.dump_package = saved
            return status, path.read_text(), out.getvalue(), err.getvalue()

    def test_check_fails_with_a_diff_and_the_command_to_run(self):
        status, text, out, err = self.run_main(document())
        self.assertEqual(status, 1)
        self.assertEqual(text, document())
        self.assertIn("-stale", out)
        self.assertIn("python3 tools/checks/module-graph.py --write", err)

    def test_write_then_check_passes_and_keeps_the_rest(self):
        status, text, _, _ = self.run_main(document(), "--write")
        self.assertEqual(status, 0)
        self.assertEqual(text, document(block=graph.render(manifest())))
        status, again, out, err = self.run_main(text, "--check")
        self.assertEqual((status, again, out, err), (0, text, "", ""))

    def test_missing_markers_stop_the_script(self):
        status, _, _, err = self.run_main("# Title\n" + TABLE)
        self.assertEqual(status, 2)
        self.assertIn(graph.BEGIN, err)


if __name__ == "__main__":
    unittest.main()
