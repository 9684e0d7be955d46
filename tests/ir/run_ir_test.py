#!/usr/bin/env python3
"""Runs the `// RUN:` lines of one .kir test file (MLIR/LLVM lit style).

    run_ir_test.py FILE --kiln PATH --filecheck PATH

In a RUN line, %s is the test file, %t a path in a fresh temporary directory,
`kiln` (at the start of a command: after a pipe, &&, ;, or !) the CLI and
`FileCheck` LLVM's FileCheck. Each line runs under bash with pipefail; the test passes when all
lines exit 0.
"""
import argparse
import re
import shutil
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--filecheck", required=True)
    args = ap.parse_args()
    with open(args.file) as f:
        runs = [m.group(1).strip() for m in re.finditer(r"^//\s*RUN:\s*(.*)$", f.read(), re.M)]
    if not runs:
        print(f"{args.file}: no RUN lines")
        return 1
    failed = 0
    tmpdir = tempfile.mkdtemp(prefix="kiln-ir-")
    for cmd in runs:
        line = cmd.replace("%s", args.file).replace("%t", os.path.join(tmpdir, "t"))
        line = re.sub(r"(^|[|&;!]\s*)kiln\b", lambda m: m.group(1) + args.kiln, line)
        line = re.sub(r"\bFileCheck\b", args.filecheck, line)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True)
        status = "ok  " if proc.returncode == 0 else "FAIL"
        print(f"{status} {cmd}")
        if proc.returncode != 0:
            failed += 1
            sys.stdout.write(proc.stdout[-4000:])
            sys.stdout.write(proc.stderr[-4000:])
    shutil.rmtree(tmpdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
