#!/usr/bin/env python3
"""tools/README.md names every entry of tools/: each file and folder at its top, and each file
and folder directly inside the kind folders (commands/, examples/, clients/, checks/, usb-rig/,
deploy/, data/). Fails, naming what is missing, when a new script or folder lacks its line.

Run from anywhere: python3 tools/checks/tools-index.py. tools/test.sh runs it.
"""
import pathlib
import subprocess
import sys

TOOLS = pathlib.Path(__file__).resolve().parents[1]
KINDS = ["commands", "examples", "clients", "checks", "usb-rig", "deploy", "data"]


def tracked():
    """The files git tracks under tools/ (so build output and caches do not count)."""
    listed = subprocess.run(["git", "ls-files", "tools"], cwd=TOOLS.parent, capture_output=True, text=True)
    if listed.returncode != 0:  # not a git checkout: every file there
        return [path.relative_to(TOOLS) for path in TOOLS.rglob("*") if path.is_file()]
    return [pathlib.Path(line).relative_to("tools") for line in listed.stdout.splitlines()]


def main() -> int:
    index = (TOOLS / "README.md").read_text(encoding="utf-8")
    entries = set()
    for path in tracked():
        parts = path.parts
        entries.add(parts[0] + ("/" if len(parts) > 1 else ""))
        if parts[0] in KINDS and len(parts) > 1:
            entries.add(f"{parts[0]}/{parts[1]}" + ("/" if len(parts) > 2 else ""))
    missing = sorted(entry for entry in entries
                     if f"`{entry}`" not in index and f"`{entry.rstrip('/')}`" not in index and entry != "README.md")
    for entry in missing:
        print(f"tools-index: tools/{entry} is not in tools/README.md: add a line saying what it is for and who runs it",
              file=sys.stderr)
    if missing:
        return 1
    print(f"tools-index: tools/README.md names all {len(entries)} entries of tools/ and its kind folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
