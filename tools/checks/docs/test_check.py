#!/usr/bin/env python3
"""Tests of check.py's rules on symbol graphs made up here: what counts as documented, what is
left out, and which DocC diagnostics count. Run: python3 tools/checks/docs/test_check.py"""
import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402

SOURCE = (check.ROOT / "Sources" / "Example" / "Example.swift").as_uri()


def symbol(name, kind="swift.property", doc=None, uri=SOURCE, line=9, precise=None, doc_module="Example"):
    entry = {
        "kind": {"identifier": kind, "displayName": kind.split(".")[-1]},
        "identifier": {"precise": precise or f"s:Example.{name}", "interfaceLanguage": "swift"},
        "pathComponents": name.split("."),
    }
    if uri:
        entry["location"] = {"uri": uri, "position": {"line": line, "character": 4}}
    if doc is not None:
        entry["docComment"] = {"module": doc_module, "lines": [{"text": text} for text in doc]}
    return entry


class UndocumentedTests(unittest.TestCase):
    def run_rules(self, symbols, graph="Example.symbols.json"):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, graph).write_text(json.dumps({"symbols": symbols, "relationships": []}))
            return check.undocumented("Example", Path(directory))

    def test_a_declaration_without_a_comment_is_reported_with_its_place(self):
        missing, counted = self.run_rules([symbol("Thing.count")])
        self.assertEqual(counted, 1)
        self.assertEqual(missing, [("Sources/Example/Example.swift", 10,
                                    "Example: Thing.count (property) has no doc comment")])

    def test_a_comment_with_a_summary_counts(self):
        missing, counted = self.run_rules([symbol("Thing.count", doc=["Items in the thing.", "", "- Note: cheap."])])
        self.assertEqual((missing, counted), ([], 1))

    def test_blank_lines_or_callouts_alone_do_not_count(self):
        missing, _ = self.run_rules([
            symbol("Thing.blank", doc=["", "   "]),
            symbol("Thing.init(path:)", kind="swift.init", doc=["- Throws: an error when the file is missing."]),
            symbol("Thing.load(_:)", kind="swift.method", doc=["- Parameter path: where."]),
        ])
        self.assertEqual([entry[2] for entry in missing], [
            "Example: Thing.blank (property) has no doc comment",
            "Example: Thing.init(path:) (init) has a doc comment with no summary (only callouts like - Throws:)",
            "Example: Thing.load(_:) (method) has a doc comment with no summary (only callouts like - Throws:)",
        ])

    def test_inherited_documentation_counts(self):
        # What the extractor gives a requirement's implementation that has no comment of its own.
        missing, counted = self.run_rules([symbol("Thing.description", doc=["A textual representation."], doc_module="Swift")])
        self.assertEqual((missing, counted), ([], 1))

    def test_synthesized_members_extension_blocks_and_outside_sources_are_not_looked_at(self):
        missing, counted = self.run_rules([
            symbol("Thing.!=(_:_:)", kind="swift.func.op", precise="s:SQsE2neoiySbx_xtFZ::SYNTHESIZED::s:Example.Thing", uri=None),
            symbol("Thing.hash(into:)", kind="swift.method", uri=None),
            symbol("Array", kind="swift.extension"),
            symbol("Tool.run()", kind="swift.method", uri=(check.ROOT / "tools" / "x" / "main.swift").as_uri()),
        ])
        self.assertEqual((missing, counted), ([], 0))

    def test_extension_graphs_are_read_too(self):
        missing, counted = self.run_rules([symbol("Array.checksum", kind="swift.property")], graph="Example@Swift.symbols.json")
        self.assertEqual(counted, 1)
        self.assertEqual(len(missing), 1)


class DocCTests(unittest.TestCase):
    def diagnostics(self, summaries, catalogue):
        """convert()'s verdict on a docc run that reported `summaries` (docc itself is faked)."""
        with tempfile.TemporaryDirectory() as directory:
            out = Path(directory)

            def fake_run(command, **kwargs):
                path = Path(command[command.index("--diagnostics-file") + 1])
                path.write_text(json.dumps({"diagnostics": [
                    {"severity": "warning", "summary": text, "source": SOURCE, "range": {"start": {"line": 3}}}
                    for text in summaries]}))
                return type("Result", (), {"returncode": 0, "stdout": "", "stderr": ""})()

            real_run, real_tool = check.run, check.toolchain_tool
            check.run, check.toolchain_tool = fake_run, lambda name: name
            try:
                return check.convert("Example", Path(directory, "Example.docc") if catalogue else None, out, out,
                                     foreign_names={"Transport", "IAPLink"})
            finally:
                check.run, check.toolchain_tool = real_run, real_tool

    def test_links_to_other_modules_pass_without_a_catalogue(self):
        self.assertEqual(self.diagnostics([
            "'Transport' doesn't exist at '/Example/Thing'",
            "'IAPLink/LinkEvent' doesn't exist at '/Example/Thing'",
        ], catalogue=False), [])

    def test_other_warnings_count(self):
        found = self.diagnostics([
            "'Thng' doesn't exist at '/Example/Thing'",
            "'scan(_:)' is ambiguous at '/Example/Thing'",
            "Parameter 'count' is missing documentation",
        ], catalogue=False)
        self.assertEqual(len(found), 3)
        self.assertTrue(found[0].startswith("Sources/Example/Example.swift:3: Example: docc warning: 'Thng'"))

    def test_in_a_catalogued_module_every_warning_counts(self):
        self.assertEqual(len(self.diagnostics(["'Transport' doesn't exist at '/Example/Thing'"], catalogue=True)), 1)


if __name__ == "__main__":
    unittest.main()
