#!/usr/bin/env python3
"""Detectors (tests/models/detectors.py), one compiled model each, run at several input
sizes and matched against ONNX Runtime's detections (boxes, scores, labels; the order of
near-equal scores free), on conditioned weights whose reference outputs are checked to be
informative first.

    run_detector_test.py [--cache-dir DIR] [--models a,b]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import detectors  # noqa: E402
import model_zoo  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--models", default=None)
    args = parser.parse_args()
    import kiln
    import onnxruntime as ort
    names = args.models.split(",") if args.models else list(detectors.DETECTORS)
    failures = 0
    for name in names:
        path = detectors.ensure_exported(name, model_zoo.cache_dir(args.cache_dir))
        compiled = kiln.compile(path, threads=1)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out_names = [o.name for o in sess.get_outputs()]
        for h, w in detectors.SIZES:
            x = detectors.image(h, w)
            ref = detectors.detections(sess.run(None, {"images": x}))
            weak = detectors.informative(ref)
            if weak:
                print(f"FAIL {name} {h}x{w}: reference not informative: {weak}")
                failures += 1
                continue
            outs = compiled.run({"images": x})
            got = detectors.detections([outs[n] for n in out_names])
            why = detectors.unmatched(ref, got)
            print(f"{'FAIL' if why else 'ok  '} {name} {h}x{w}: {len(ref[1])} detections, "
                  f"{len(set(ref[2].tolist()))} labels, score std {ref[1].std():.3f}" + (f": {why}" if why else ""),
                  flush=True)
            failures += why is not None
    return 1 if failures else 0


if __name__ == "__main__":
    model_zoo.run_main(main)
