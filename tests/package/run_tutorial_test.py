"""docs/tutorial/README.md, run as written: every ```sh and ```python block in order, in one
fresh directory, with the build's kiln, the tutorial's programs and the Python module on the
paths its set-up section names (unlabelled blocks are set-up and excerpts, not run). A block
that exits non-zero fails the test; the blocks' own asserts check what they print.

    run_tutorial_test.py --build-dir build
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIAL = os.path.join(SOURCE_DIR, "docs", "tutorial", "README.md")


def blocks(text):
    """(language, code) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    venv_bin = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.join(build, "bin"), os.path.join(build, "docs", "tutorial"), venv_bin,
                                   env.get("PATH", "")])
    env["PYTHONPATH"] = os.path.join(build, "python")
    env["KILN_DB"] = "off"
    runnable = [(lang, code) for lang, code in blocks(open(TUTORIAL).read()) if lang in ("sh", "python")]
    assert len(runnable) >= 10, f"only {len(runnable)} runnable blocks in {TUTORIAL}"
    work = tempfile.mkdtemp(prefix="kiln_tutorial_")
    try:
        for i, (lang, code) in enumerate(runnable, 1):
            print(f"--- block {i} ({lang}) ---\n{code.strip()}\n--- output ---", flush=True)
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            print((proc.stdout + proc.stderr)[-3000:], flush=True)
            if proc.returncode != 0:
                print(f"FAIL: block {i} exited {proc.returncode}", file=sys.stderr)
                return 1
        print(f"tutorial ran: {len(runnable)} blocks")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
