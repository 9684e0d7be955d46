"""Kiln: compile an ONNX model and run it on numpy arrays or DLPack tensors.

    import kiln
    model = kiln.compile("resnet18.onnx", threads=2)
    outputs = model.run({"input": x})        # dict name -> numpy array
    model.inputs, model.outputs              # names, dtypes, dims (symbolic dims as text)
    print(model.profile())                   # time per kernel, most expensive first

A model is a path, the model's bytes, an onnx.ModelProto, or a torch.nn.Module with
example inputs (exported to ONNX for you). Every error Kiln reports (bad or unsupported model,
wrong input at run time) raises kiln.KilnError, a RuntimeError whose message names the file,
node, op or input.
"""

import io
import os

from ._kiln import KilnError, TensorInfo, __version__  # noqa: F401
from . import _kiln

__all__ = ["compile", "load", "Trainer", "describe_model_file", "CompiledModel", "KilnError", "TensorInfo", "__version__"]

# Kiln compiles in float32; the precisions it accepts.
PRECISIONS = ("fp32",)


def _check_str_list(name, value):
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"{name} must be a list of str")
    return list(value)


def _export_torch(module, example_inputs, input_names, opset):
    """A torch.nn.Module exported to ONNX bytes with torch.onnx.export."""
    import torch  # only when a module is given

    if example_inputs is None:
        raise TypeError("kiln.compile(torch.nn.Module) needs example_inputs (a tensor or a tuple of tensors)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if input_names is None:
        input_names = [f"input_{i}" for i in range(len(example_inputs))]
    buf = io.BytesIO()
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            torch.onnx.export(module, example_inputs, buf, input_names=list(input_names),
                              opset_version=opset, do_constant_folding=False)
    finally:
        module.train(was_training)
    return buf.getvalue()


def compile(model, threads=0, precision="fp32", db=None, select="priority", prefer=None,  # noqa: A001
            passes=None, max_memory=0, naive=False, example_inputs=None, input_names=None, opset=17,
            gradient_of=None, gradient_wrt=None):
    """Compiles a model; returns a CompiledModel.

    model: a path (str or os.PathLike), the model's bytes, an onnx.ModelProto, or a
        torch.nn.Module, exported with `example_inputs` (a tensor or a tuple of them;
        `input_names` names them, default input_0, input_1, ...; `opset` the ONNX opset).
    threads: worker threads, 0 for all hardware threads.
    precision: "fp32" (the only one Kiln compiles today).
    db: the tuning database kernel choice asks first (a path or a postgresql:// URL;
        `kiln tune` fills it); None for the default ($KILN_DB, else
        ~/.cache/kiln/tuning.db where it exists), "" for none.
    select: "priority" (the operator strategy's choice) or "measure" (time every applicable
        implementation of each MatMul/Gemm/Conv at compile time, keep the fastest).
    prefer: implementations preferred where they apply, e.g. ["conv.panels",
        "matmul.packed:mr=6 nr=64"] (`kiln info MODEL --kernels` lists the names).
    passes: graph passes by name (`kiln opt --list-passes`), in order; None for the
        default pipeline, [] for none (shape inference always runs).
    max_memory: bytes one run may allocate (0: 80% of physical memory); more is a KilnError.
    naive: reference schedules (no fusion of loops, serial).
    gradient_of: the name of an output (a float value of one element, a loss): the model also
        returns its gradient with respect to `gradient_wrt` (names of inputs or initializers;
        None: every float constant, Constant nodes' included), as outputs "<name>_grad", computed by reverse mode over
        the graph and compiled with it (docs/training.md).

    Any number of compiled models may run at once from any number of threads; calls
    to one model from several threads are serialized.
    """
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, got {type(threads).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not supported: Kiln compiles in float32 "
                         f"(precision='fp32')")
    if select not in ("priority", "measure"):
        raise ValueError(f"select must be 'priority' or 'measure', not {select!r}")
    passes = _check_str_list("passes", passes)
    prefer = _check_str_list("prefer", prefer) or []
    if db is not None:
        if not isinstance(db, (str, os.PathLike)):
            raise TypeError(f"db must be a path or URL, got {type(db).__name__}")
        db = os.fspath(db)
    gradient_wrt = _check_str_list("gradient_wrt", gradient_wrt) or []
    if gradient_of is not None and not isinstance(gradient_of, str):
        raise TypeError(f"gradient_of must be an output's name, got {type(gradient_of).__name__}")
    kwargs = dict(threads=threads, naive=bool(naive), max_memory=int(max_memory), passes=passes, db=db,
                  select=select, prefer=prefer, gradient_of=gradient_of or "", gradient_wrt=gradient_wrt)
    source_name = "<bytes>"
    if type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString"):
        model, source_name = model.SerializeToString(), "<onnx.ModelProto>"
    elif _is_torch_module(model):
        source_name = f"<torch {type(model).__name__}>"
        model = _export_torch(model, example_inputs, input_names, opset)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return CompiledModel(_kiln.compile_bytes(bytes(model), source_name=source_name, **kwargs))
    if isinstance(model, (str, os.PathLike)):
        return CompiledModel(_kiln.compile_file(os.fspath(model), **kwargs))
    raise TypeError("kiln.compile expects a path, the model's bytes, an onnx.ModelProto or a "
                    f"torch.nn.Module, got {type(model).__name__}")


def _is_torch_module(obj):
    for cls in type(obj).__mro__:
        if cls.__module__ == "torch.nn.modules.module" and cls.__name__ == "Module":
            return True
    return False


class CompiledModel:
    """A compiled model. `run` it on arrays; `inputs` / `outputs` describe its signature."""

    def __init__(self, impl):
        self._impl = impl

    @property
    def inputs(self):
        return self._impl.inputs

    @property
    def outputs(self):
        return self._impl.outputs

    @property
    def stats(self):
        return self._impl.stats

    def graph_text(self):
        """The optimized graph in Kiln's text IR (empty for a loaded package)."""
        return self._impl.graph_text()

    def save(self, path):
        """Writes the compiled model as a package (`kiln compile`'s format): kernels as a shared
        library, weights, bytecode, memory plan, signatures. `kiln.load` runs it without a
        compiler. Linking the kernels needs a C compiler driver ($KILN_CC, else cc)."""
        self._impl.save(os.fspath(path))

    @property
    def package_metadata(self):
        """A loaded package's description (a dict); None for a compiled model."""
        import json

        text = self._impl.package_metadata
        return json.loads(text) if text else None

    def run(self, inputs, outputs=None):
        """Runs the model.

        inputs: dict name -> array: a numpy array (or anything numpy.asarray takes), or an
            object with __dlpack__ on the CPU (a torch tensor), read without a copy when
            contiguous. A model with one input also takes the array itself.
        outputs: dict name -> the caller's buffer (a writable C-contiguous numpy array, or a
            contiguous __dlpack__ tensor) of that output's dtype and shape: the kernels write
            into it (a buffer not 64-byte aligned gets the result copied in). Outputs not named
            are returned as numpy arrays over Kiln's own buffers (no copy; each stays valid
            however many runs follow).
        Returns a dict name -> array (the caller's buffer where one was given).
        """
        if not isinstance(inputs, dict):
            if len(self.inputs) != 1:
                raise TypeError("run expects a dict name -> array (the model has "
                                f"{len(self.inputs)} inputs)")
            inputs = {self.inputs[0].name: inputs}
        if outputs is not None and not isinstance(outputs, dict):
            raise TypeError(f"outputs must be a dict name -> buffer, got {type(outputs).__name__}")
        return self._impl.run(inputs, outputs)

    def random_inputs(self, seed=0, dims=None):
        """Random inputs for every input (standard normal floats, small non-negative integers,
        random booleans); `dims` binds symbolic dims by name (default 1)."""
        import numpy as np

        dims = dict(dims or {})
        rng = np.random.default_rng(seed)
        feeds = {}
        for info in self.inputs:
            shape = []
            for d in info.dims:
                if d.lstrip("-").isdigit():
                    shape.append(int(d))
                elif d in dims:
                    shape.append(int(dims[d]))
                else:
                    shape.append(1)
            dtype = np.dtype(info.dtype) if info.dtype not in ("object",) else None
            if dtype is None:
                raise KilnError(f"input '{info.name}': no random values for dtype {info.dtype}; pass inputs")
            if dtype.kind == "f":
                feeds[info.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind in "iu":
                feeds[info.name] = rng.integers(0, 2, shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[info.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                raise KilnError(f"input '{info.name}': no random values for dtype {info.dtype}; pass inputs")
        return feeds

    def profile(self, inputs=None, runs=10, path=None):
        """Runs the model `runs` times timing every instruction; returns the report (kernels by
        total time). inputs: as for run; None for random_inputs(). path: also write a Chrome
        trace / Perfetto JSON of every kernel call there."""
        if inputs is None:
            inputs = self.random_inputs()
        elif not isinstance(inputs, dict):
            inputs = {self.inputs[0].name: inputs}
        return self._impl._profile(inputs, int(runs), "" if path is None else os.fspath(path))


class Trainer:
    """Training with Kiln: one step (forward, backward, gradient clipping, the optimizer's
    update) compiled as one graph (docs/training.md). The parameters and the optimizer's state
    live here as numpy arrays; `step(feeds)` runs one step on a batch and returns the loss.

    model: as for kiln.compile (a path, bytes, an onnx.ModelProto, or a torch.nn.Module with
        `example_inputs`), whose output `loss` is the value to minimize. A model in ONNX's
        training form (training_info: a loss, Gradient and optimizer ops) trains by its own
        algorithm when neither `loss` nor `optimizer` is given: its initialization graph, if
        any, runs first; an algorithm input "kiln.lr" takes lr; step() returns the loss (the
        y of its first Gradient node); the other optimizer arguments do not apply.
    loss: the name of that output (default "loss"), or a loss Kiln appends: "mse", "l1", "bce" (binary
        cross-entropy of logits) or "cross_entropy" (logits [N, C, ...] against int64 class
        indices [N, ...]), the mean over the elements, of the output `prediction` (None: the
        first) against a new input `target` that each step's batch holds.
    params: initializer names to train; None: every float initializer.
    optimizer: "sgd" (the default; momentum=, nesterov=), "adam" or "adamw" (betas=, eps=);
        weight_decay=: L2 for sgd and adam, decoupled for adamw; clip_norm=: the gradients'
        global norm at most this (0: no clipping); lr: the learning rate, or pass lr= to step().
    memory_budget: bytes (or a size such as "512MB") the step's activations may take: Kiln
        computes some forward values again in the backward to fit (automatic checkpointing,
        static shapes only); a budget it cannot meet raises KilnError saying the least it can.
        checkpoint_policy: "dp" (default) or "sqrt" (Chen et al.'s equal segments).
    stats: the compiled step's CompileStats as a dict (activation_bytes, peak_bytes, peak_at and
        peak_values (where the most arena bytes are live, the largest values there), and under
        a budget unbudgeted_activation_bytes, recomputed_segments, recomputed_values, recomputed_calls,
        recompute_share).
    """

    def __init__(self, model, loss=None, params=None, optimizer=None, lr=0.01, momentum=0.0,
                 nesterov=False, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip_norm=0.0,
                 threads=0, db=None, example_inputs=None, input_names=None, opset=17, target="target",
                 prediction=None, memory_budget=None, checkpoint_policy="dp"):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        if _is_torch_module(model):
            model = _export_torch(model, example_inputs, input_names, opset)
        if isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model))
        elif isinstance(model, (bytes, bytearray, memoryview)):
            proto = onnx.load_from_string(bytes(model))
        elif type(model).__name__ == "ModelProto":
            proto = model
        else:
            raise TypeError("Trainer expects a path, the model's bytes, an onnx.ModelProto or a "
                            f"torch.nn.Module, got {type(model).__name__}")
        initial = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        own = len(proto.training_info) > 0 and loss is None and optimizer is None
        if own:
            if params is not None or momentum or nesterov or weight_decay or clip_norm or prediction:
                raise KilnError("the model trains by its own algorithm (training_info): params, momentum, "
                                "nesterov, weight_decay, clip_norm and prediction go with loss= or optimizer=")
            algorithm = proto.training_info[0]
            initial.update({i.name: numpy_helper.to_array(i) for i in algorithm.algorithm.initializer})
            if algorithm.HasField("initialization") and len(algorithm.initialization.output):
                initial.update(_run_initialization(proto, algorithm, threads))
            # The model's initializers the algorithm updates; the algorithm's own are state.
            main = {i.name for i in proto.graph.initializer}
            params = [e.key for e in algorithm.update_binding if e.key in main]
        loss = "loss" if loss is None else loss
        optimizer = "sgd" if optimizer is None else optimizer
        if params is None:
            # Every float initializer but BatchNormalization's running statistics in training form
            # (step state, updated by the node).
            running = {i for node in proto.graph.node if node.op_type == "BatchNormalization"
                       and any(a.name == "training_mode" and a.i for a in node.attribute) for i in node.input[3:5]}
            params = [n for n, a in initial.items() if a.dtype in (np.float32, np.float64) and n not in running]
        params = _check_str_list("params", params)
        unknown = [p for p in params if p not in initial]
        if unknown:
            raise KilnError(f"params {unknown} are not initializers of the model")
        kind = "cross_entropy" if loss == "cross-entropy" else loss
        loss_kind = kind if kind in ("mse", "l1", "bce", "cross_entropy") else ""
        if loss_kind:
            loss = "kiln.loss"
        settings = dict(loss=loss, loss_kind=loss_kind, target=str(target), prediction=prediction or "", params=params, optimizer=optimizer, momentum=float(momentum),
                        nesterov=bool(nesterov), beta1=float(betas[0]), beta2=float(betas[1]), eps=float(eps),
                        weight_decay=float(weight_decay), clip_norm=float(clip_norm),
                        memory_budget=_byte_size("memory_budget", memory_budget),
                        checkpoint_policy=str(checkpoint_policy), model_algorithm=own)
        self._impl = _kiln.compile_bytes(proto.SerializeToString(), threads=threads, db=db if db is None else os.fspath(db),
                                         source_name="<trainer>", train=settings)
        self.loss_name = self._impl.outputs[0].name
        self.lr = lr
        self.steps = 0
        # 64-byte aligned, as Kiln's kernels read them (the VM copies a misaligned input each step).
        self.params = {p: _aligned(initial[p]) for p in params}
        names = {i.name: i for i in self._impl.inputs}
        outputs = {o.name for o in self._impl.outputs}
        # State: the step's inputs it outputs again as "<name>.next" besides the parameters: the
        # optimizer's (zeros at first) and BatchNormalization's running statistics (as stored).
        self.state = {n: _aligned(initial[n]) if n in initial
                      else _aligned(np.zeros([int(d) for d in info.dims], np.dtype(info.dtype)))
                      for n, info in names.items() if n + ".next" in outputs and n not in self.params}
        self._dtype = np.dtype(names["kiln.lr"].dtype) if "kiln.lr" in names else None
        self._feeds_step = "kiln.step" in names and not own

    @property
    def stats(self):
        return self._impl.stats

    def step(self, feeds, lr=None):
        """One step on the batch `feeds` (dict name -> array); returns the loss before the update."""
        import numpy as np

        self.steps += 1
        inputs = dict(feeds)
        inputs.update(self.params)
        inputs.update(self.state)
        if self._dtype is not None:
            inputs["kiln.lr"] = np.array(self.lr if lr is None else lr, self._dtype)
        if self._feeds_step:
            inputs["kiln.step"] = np.array(self.steps, self._dtype)
        out = self._impl.run(inputs, None)
        for name in self.params:
            self.params[name] = out[name + ".next"]
        for name in self.state:
            self.state[name] = out[name + ".next"]
        return float(out[self.loss_name])


def _run_initialization(proto, info, threads):
    """The values a training algorithm's initialization graph gives the initializers it binds."""
    import onnx

    init = onnx.helper.make_model(info.initialization, opset_imports=list(proto.opset_import),
                                  ir_version=proto.ir_version)
    compiled = _kiln.compile_bytes(init.SerializeToString(), threads=threads, db=None,
                                   source_name="<initialization graph>")
    out = compiled.run({}, None)
    return {e.key: out[e.value] for e in info.initialization_binding}


def _aligned(array):
    """A copy of `array` whose data starts on a 64-byte boundary."""
    import numpy as np

    array = np.asarray(array)
    raw = np.empty(array.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _byte_size(what, value):
    """None: 0; an int: itself; a str such as "512MB": its bytes."""
    if value is None:
        return 0
    if isinstance(value, str):
        return int(_kiln.parse_byte_size(value))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KilnError(f"{what} must be a positive number of bytes or a size such as '512MB', got {value!r}")
    return int(value)


def load(path, threads=0, max_memory=0):
    """Loads a package written by `CompiledModel.save` or `kiln compile MODEL -o model.kiln`:
    no compiler runs and the weights stay in the mapped file. A truncated, corrupt or foreign
    file, another package format, or kernels using CPU features this host lacks raise KilnError."""
    return CompiledModel(_kiln.load(os.fspath(path), threads=int(threads), max_memory=int(max_memory)))


def describe_model_file(path):
    """Text report on a model file: inputs, outputs, op histogram, inferred types."""
    return _kiln.describe_model_file(os.fspath(path))
