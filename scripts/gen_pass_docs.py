#!/usr/bin/env python3
"""Regenerates the pass table of docs/passes.md from the pass registry.

    gen_pass_docs.py [--kiln build/bin/kiln]

The table between `<!-- passes:begin -->` and `<!-- passes:end -->` is replaced
by the output of `kiln opt --list-passes --markdown`; tests/ir/pass_manager.kir
fails when the two disagree.
"""
import argparse
import pathlib
import subprocess
import sys


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=str(root / "build" / "bin" / "kiln"))
    args = ap.parse_args()
    table = subprocess.run([args.kiln, "opt", "--list-passes", "--markdown"], check=True,
                           capture_output=True, text=True).stdout
    doc = root / "docs" / "passes.md"
    text = doc.read_text()
    begin, end = "<!-- passes:begin -->\n", "<!-- passes:end -->"
    if begin not in text or end not in text:
        print(f"{doc}: markers {begin.strip()} / {end} not found", file=sys.stderr)
        return 1
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(head + begin + table + end + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
