"""Kiln: compile an ONNX model and run it on numpy arrays.

    import kiln
    model = kiln.compile("resnet18.onnx", threads=2)
    outputs = model.run({"input": x})        # dict name -> numpy array
    model.inputs, model.outputs              # names, dtypes, dims (symbolic dims as text)
    print(model.graph_text())

Every error Kiln reports (bad or unsupported model, wrong input at run time) raises
kiln.KilnError, a RuntimeError whose message names the file, node, op or input.
"""

import os

from ._kiln import CompiledModel, KilnError, TensorInfo  # noqa: F401
from . import _kiln

__all__ = ["compile", "describe_model_file", "CompiledModel", "KilnError", "TensorInfo"]


def compile(model, threads=0, naive=False, max_memory=0, passes=None, db=None):  # noqa: A001 (the API's name)
    """Compiles an ONNX model given as a path (str or os.PathLike) or as serialized bytes.

    threads: worker threads, 0 for all hardware threads. naive: reference schedules.
    max_memory: bytes one run may allocate (0: 80% of physical memory); more is a KilnError.
    passes: graph passes by name (`kiln opt --list-passes`), in order; None for the
    default pipeline, [] for none (shape inference always runs).
    db: the tuning database kernel choice asks first (a path; `kiln tune` fills it); None for
    the default ($KILN_DB, else ~/.cache/kiln/tuning.db where it exists), "" for none.
    Any number of compiled models may run at once from any number of threads; calls
    to one model from several threads are serialized.
    """
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, got {type(threads).__name__}")
    if passes is not None:
        if isinstance(passes, str) or not all(isinstance(p, str) for p in passes):
            raise TypeError("passes must be a list of pass names")
        passes = list(passes)
    if db is not None:
        if not isinstance(db, (str, os.PathLike)):
            raise TypeError(f"db must be a path, got {type(db).__name__}")
        db = os.fspath(db)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _kiln.compile_bytes(bytes(model), threads=threads, naive=bool(naive),
                                   max_memory=int(max_memory), passes=passes, db=db)
    if isinstance(model, (str, os.PathLike)):
        return _kiln.compile_file(os.fspath(model), threads=threads, naive=bool(naive),
                                  max_memory=int(max_memory), passes=passes, db=db)
    raise TypeError("kiln.compile expects a path or the model's bytes, got "
                    f"{type(model).__name__}")


def describe_model_file(path):
    """Text report on a model file: inputs, outputs, op histogram, inferred types."""
    return _kiln.describe_model_file(os.fspath(path))
