#!/usr/bin/env python3
"""Exports the model zoo (tests/models/model_zoo.py) to ONNX into the cache directory.

    export_models.py [--cache-dir DIR] [--models a,b] [--force]

A model already in the cache is kept unless --force. Weights are random (fixed seeds),
nothing is downloaded.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402


def ensure_exported(spec, cache=None, force=False, quiet=False):
    """Returns the path of the model's ONNX file, exporting it first if needed."""
    path = spec.path(cache)
    if os.path.exists(path) and not force:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    start = time.time()
    model_zoo.export(spec, path)
    if not quiet:
        size = os.path.getsize(path) / 1e6
        print(f"exported {spec.name}: {path} ({size:.1f} MB, {time.time() - start:.1f} s)",
              flush=True)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--models", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else [m.name for m in model_zoo.MODELS]
    unknown = [n for n in names if n not in model_zoo.MODELS_BY_NAME]
    if unknown:
        print(f"unknown model(s): {', '.join(unknown)}; known: "
              f"{', '.join(model_zoo.MODELS_BY_NAME)}", file=sys.stderr)
        return 2
    for name in names:
        path = ensure_exported(model_zoo.MODELS_BY_NAME[name], args.cache_dir, args.force)
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
