"""torchvision's detectors for the dynamic-models checks (issue 8): exported with random,
conditioned weights so detections survive the score threshold, compared with ONNX Runtime.

Conditioning: batch-norm statistics come from random images (BN layers in train mode, the
rest in eval), and the classification logits are scaled so the scores spread over classes;
without it every score is equal (ssdlite) or no box passes the threshold (Faster R-CNN), and a
comparison of equal or empty outputs proves nothing.
"""

import os

import numpy as np

SEED = 0
OPSET = 13
# name -> factor on the classification logits' weights
DETECTORS = {
    "ssdlite320_mobilenet_v3_large": 10.0,
    "fasterrcnn_mobilenet_v3_large_320_fpn": 30.0,
}
SIZES = [(320, 320), (360, 480), (480, 640)]


def path(name, cache):
    return os.path.join(cache, name + ".onnx")


def export(name, out_path):
    import torch
    import torchvision
    torch.manual_seed(SEED)
    model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None).eval()
    bns = [b for b in model.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None
        b.train()
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _ in range(4):
            model([torch.rand(3, 320, 320, generator=gen) for _ in range(2)])
        for b in bns:
            b.eval()
        scale = DETECTORS[name]
        if name.startswith("ssdlite"):
            for m in model.head.classification_head.modules():
                if isinstance(m, torch.nn.Conv2d) and m.out_channels % 91 == 0:
                    m.weight.mul_(scale)
        else:
            model.roi_heads.box_predictor.cls_score.weight.mul_(scale)
    tmp = out_path + ".tmp"
    torch.onnx.export(model, (torch.rand(1, 3, 320, 320, generator=gen),), tmp, opset_version=OPSET,
                      input_names=["images"], output_names=["boxes", "out1", "out2"],
                      dynamic_axes={"images": {2: "height", 3: "width"}})
    os.replace(tmp, out_path)


def ensure_exported(name, cache):
    p = path(name, cache)
    if not os.path.exists(p):
        os.makedirs(cache, exist_ok=True)
        export(name, p)
    return p


def image(h, w):
    return np.random.default_rng(SEED).random((1, 3, h, w), dtype=np.float32)


def detections(outputs):
    """(boxes [n, 4], scores [n], labels [n]) from a detector's outputs, whatever their order."""
    outputs = list(outputs)
    boxes = next(v for v in outputs if v.ndim == 2)
    scores = next(v for v in outputs if v.ndim == 1 and v.dtype.kind == "f")
    labels = next(v for v in outputs if v.ndim == 1 and v.dtype.kind in "iu")
    return boxes, scores, labels


def unmatched(ref, got, score_tol=1e-4, box_tol=1e-2):
    """None when every detection of `got` matches one of `ref` (same label, score and box
    within the tolerances; the order of near-equal scores may differ); else why not."""
    rb, rs, rl = ref
    gb, gs, gl = got
    if len(rs) != len(gs):
        return f"{len(gs)} detections, ONNX Runtime has {len(rs)}"
    used = np.zeros(len(rs), bool)
    for i in range(len(gs)):
        close = (~used & (rl == gl[i]) & (np.abs(rs - gs[i]) <= score_tol)
                 & (np.abs(rb - gb[i]).max(axis=1, initial=0) <= box_tol))
        hits = np.flatnonzero(close)
        if len(hits) == 0:
            return f"detection {i} (label {gl[i]}, score {gs[i]:.5f}, box {gb[i].tolist()}) has no match"
        used[hits[0]] = True
    return None


def informative(ref):
    """Why a reference is too degenerate to compare against, or None."""
    _, scores, labels = ref
    if len(scores) < 10:
        return f"only {len(scores)} detections"
    if scores.std() < 1e-3:
        return f"scores do not vary (std {scores.std():.2e})"
    if len(set(labels.tolist())) < 3:
        return f"only {len(set(labels.tolist()))} labels"
    return None
