#!/usr/bin/env python3
"""Validates iapctl --json output against docs/json-schema.json.

Usage: tools/checks/json-output.py DEF FILE...
  DEF   the schema's $defs entry for the command (list, info, wait, watch, send, decode, stats)
  FILE  iapctl's standard output: one JSON object per line, at least one line
Exit status: 0 every line of every file is valid, 1 one is not (each problem printed), 64 usage.
Needs the jsonschema module (Debian: python3-jsonschema).
"""
import os
import sys

import json  # noqa: E402

import jsonschema  # noqa: E402

if len(sys.argv) < 3:
    print(__doc__, file=sys.stderr)
    sys.exit(64)
definition, files = sys.argv[1], sys.argv[2:]
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "..", "docs", "json-schema.json")) as schema_file:
    schema = json.load(schema_file)
jsonschema.Draft202012Validator.check_schema(schema)
if definition not in schema["$defs"]:
    print(f"check-json: no $defs entry '{definition}' in the schema", file=sys.stderr)
    sys.exit(64)
# The command's own shape, with the schema's definitions to resolve references in.
validator = jsonschema.Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"})
problems = 0
for path in files:
    lines = [line for line in open(path) if line.strip()]
    if not lines:
        print(f"check-json: {path}: no JSON lines", file=sys.stderr)
        problems += 1
    for number, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            print(f"check-json: {path}:{number}: not JSON: {error}", file=sys.stderr)
            problems += 1
            continue
        for error in validator.iter_errors(value):
            where = "/".join(str(part) for part in error.absolute_path) or "(the line)"
            print(f"check-json: {path}:{number}: {where}: {error.message}", file=sys.stderr)
            problems += 1
sys.exit(1 if problems else 0)
