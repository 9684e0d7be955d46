"""PyTorch integration: `kiln.torch.compile(module, example_inputs)` returns an nn.Module whose
forward and backward run in Kiln, for an ordinary PyTorch training loop with any optimizer.

On the first call in a mode (module.training) and with given input shapes and dtypes, the module
is exported to ONNX with its parameters and buffers as graph inputs, and compiled twice: the
forward, and its vector-Jacobian product (the backward: the gradient of sum_k <output_k, grad_k>
with respect to the inputs and parameters, by Kiln's reverse mode over the graph,
`docs/training.md`). A call in another mode or with other shapes compiles again (each kept).
The parameters stay PyTorch's: the optimizer updates them, and each call reads them as they are
(numpy views of the tensors, no copy). Outputs come back as tensors over Kiln's buffers (no
copy). The backward recomputes the forward inside the compiled VJP graph.

In training mode BatchNormalization normalizes with the batch's statistics and its running
statistics are updated as PyTorch's are (the variance unbiased, num_batches_tracked counted);
Dropout draws a fresh mask each call (Kiln's generator, not PyTorch's), which the forward returns
and the backward multiplies by instead of drawing another.
"""
import io

import numpy as np
import torch as _torch

from . import compile as _compile


def compile(module, example_inputs=None, threads=0, db="", opset=17):  # noqa: A001 (kiln.torch.compile)
    """Wraps `module` (an nn.Module) so that its forward and backward run in Kiln.
    example_inputs: unused beyond documentation of the call (the export happens on the first
    call, with that call's inputs)."""
    if not isinstance(module, _torch.nn.Module):
        raise TypeError(f"kiln.torch.compile expects a torch.nn.Module, got {type(module).__name__}")
    return KilnModule(module, threads=threads, db=db, opset=opset)


def _numpy(t):
    return t.detach().contiguous().numpy()


class _KilnFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, built, *tensors):
        outs = built.forward_model.run(built.feeds(tensors))
        built.update_running_statistics(owner._state(), outs)
        ctx.built = built
        ctx.masks = {saved: np.array(outs[mask]) for mask, saved in built.masks}
        ctx.save_for_backward(*tensors)
        results = tuple(_torch.from_numpy(outs[name]) for name in built.outputs)
        return results if len(results) > 1 else results[0]

    @staticmethod
    def backward(ctx, *grads):
        built = ctx.built
        tensors = ctx.saved_tensors
        feeds = built.feeds(tensors)
        feeds.update(ctx.masks)
        for name, g, info in zip(built.outputs, grads, built.output_infos):
            feeds[name + ".grad_in"] = (np.zeros(info[0], info[1]) if g is None else _numpy(g))
        outs = built.vjp_model.run(feeds)
        result = [None, None]  # owner, built
        for name in built.input_names:
            result.append(_torch.from_numpy(outs[name + "_grad"]) if name in built.wrt else None)
        return tuple(result)


def _constant(proto, name):
    """The value of a Constant node's output or an initializer named `name` (None: neither)."""
    from onnx import numpy_helper

    for i in proto.graph.initializer:
        if i.name == name:
            return numpy_helper.to_array(i)
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


class _Built:
    """The forward and VJP programs of one mode and one set of input shapes and dtypes."""

    def __init__(self, module, inputs, threads, db, opset):
        import onnx
        from onnx import TensorProto, helper

        user = [f"input_{i}" for i in range(len(inputs))]
        buf = io.BytesIO()
        # Exported in the module's own mode (PRESERVE: EVAL would fold BatchNormalization into the
        # convolutions' weights, which are then no longer the module's). The exporter also merges
        # parameters and buffers of equal values into one graph input (two fresh LayerNorms'
        # weights, all ones), so they are given distinct values for the export; it runs the module
        # once, which in training mode would also move the running statistics. All are put back.
        # PyTorch's generator is the user's: the values are constants, and the trace's own draws
        # (Dropout in training mode) are undone with the generator's state.
        kept = {name: t.clone() for name, t in module.state_dict().items()}
        try:
            with _torch.no_grad(), _torch.random.fork_rng(devices=[]):
                for k, t in enumerate(module.state_dict().values()):
                    if t.dtype != _torch.bool:
                        t.fill_(k + 1)
                _torch.onnx.export(module, tuple(inputs), buf, input_names=user, export_params=False,
                                   do_constant_folding=False, opset_version=opset,
                                   training=_torch.onnx.TrainingMode.PRESERVE)
        finally:
            with _torch.no_grad():
                for name, t in module.state_dict().items():
                    t.copy_(kept[name])
        proto = onnx.load_from_string(buf.getvalue())
        state = dict(module.named_parameters())
        state.update(dict(module.named_buffers()))
        extra = [i.name for i in proto.graph.input[len(user):]]
        unknown = [n for n in extra if n not in state]
        if unknown:
            raise RuntimeError(f"the exported model takes inputs {unknown} that are not the module's "
                               "parameters or buffers")
        self.input_names = user + extra
        self.outputs = [o.name for o in proto.graph.output]
        # Dropout in training mode: the forward program also returns its mask, and the VJP
        # program, instead of drawing another, multiplies by the mask it is given.
        dropouts = []  # (node index, rate)
        for k, n in enumerate(proto.graph.node):
            if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
                ratio = _constant(proto, n.input[1]) if len(n.input) > 1 and n.input[1] else np.array(0.5)
                on = _constant(proto, n.input[2])
                if on is None or ratio is None:
                    raise RuntimeError(f"kiln.torch: Dropout '{n.name}' with a rate or training mode computed at "
                                       "run time is not supported")
                if bool(on) and float(ratio) != 0.0:
                    if len(n.output) < 2 or not n.output[1]:
                        del n.output[1:]
                        n.output.append(n.output[0] + ".mask")
                    dropouts.append((k, float(ratio)))
        # BatchNormalization in training form: its updated running statistics (outputs 1 and 2)
        # become outputs of the forward program, written back into the module's buffers.
        # (mean buffer, var buffer, count buffer or None, mean out, var out, elements per channel,
        #  ONNX momentum: the share of the old statistics)
        self.running = []
        stats_proto = onnx.shape_inference.infer_shapes(proto)
        typed = list(stats_proto.graph.value_info) + list(stats_proto.graph.input) + list(stats_proto.graph.output)
        shapes = {v.name: v.type.tensor_type.shape for v in typed}
        elem = {v.name: v.type.tensor_type.elem_type for v in typed}
        forward_proto = onnx.ModelProto()
        forward_proto.CopyFrom(proto)
        self.masks = []  # (forward output, VJP input)
        for k, _ in dropouts:
            mask = proto.graph.node[k].output[1]
            forward_proto.graph.output.append(helper.make_tensor_value_info(mask, TensorProto.BOOL, None))
            self.masks.append((mask, mask + ".saved"))
        for n in proto.graph.node:
            if n.op_type != "BatchNormalization" or not any(a.name == "training_mode" and a.i for a in n.attribute):
                continue
            if len(n.output) < 3 or not n.output[1] or not n.output[2]:
                continue
            mean_in, var_in = n.input[3], n.input[4]
            if mean_in not in state or var_in not in state:
                raise RuntimeError(f"kiln.torch: BatchNormalization '{n.name}' reads running statistics "
                                   f"{mean_in}, {var_in} that are not the module's buffers")
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in shapes[n.input[0]].dim] \
                if n.input[0] in shapes else []
            if len(dims) < 2 or any(d <= 0 for d in dims):
                raise RuntimeError(f"kiln.torch: the input shape of BatchNormalization '{n.name}' is not known "
                                   "after export (its running variance needs the count per channel)")
            count = int(np.prod(dims)) // dims[1]
            momentum = next((a.f for a in n.attribute if a.name == "momentum"), 0.9)
            prefix = mean_in[: -len("running_mean")] if mean_in.endswith("running_mean") else None
            tracked = prefix + "num_batches_tracked" if prefix is not None else None
            self.running.append((mean_in, var_in, tracked if tracked in state else None, n.output[1], n.output[2],
                                 count, momentum))
            for out in (n.output[1], n.output[2]):
                forward_proto.graph.output.append(
                    helper.make_tensor_value_info(out, elem.get(n.input[3], TensorProto.FLOAT), None))
        for m in module.modules():
            if isinstance(m, _torch.nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats \
                    and m.momentum is None:
                raise RuntimeError("kiln.torch: BatchNormalization with momentum=None (a cumulative average) "
                                   "in training mode is not supported")
        forward = forward_proto.SerializeToString()

        # The VJP graph: each training Dropout replaced by x * mask / (1 - rate) over the mask the
        # forward drew (an input); a grad input per output, the scalar sum_k <output_k, grad_k>.
        replaced = {}
        for k, ratio in dropouts:
            n = proto.graph.node[k]
            x, y, mask = n.input[0], n.output[0], n.output[1]
            saved = mask + ".saved"
            mask_shape = helper.make_tensor_value_info(saved, TensorProto.BOOL, None)
            if x in shapes:
                mask_shape.type.tensor_type.shape.CopyFrom(shapes[x])
            proto.graph.input.append(mask_shape)
            x_type = elem.get(x, TensorProto.FLOAT)
            if x_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
                raise RuntimeError(f"kiln.torch: Dropout '{n.name}' in training mode on a tensor that is not "
                                   "f32 or f64")
            scale = np.array(1.0 / (1.0 - ratio), np.float64 if x_type == TensorProto.DOUBLE else np.float32)
            replaced[k] = [
                helper.make_node("Cast", [saved], [y + ".keep"], to=x_type),
                helper.make_node("Mul", [x, y + ".keep"], [y + ".kept"]),
                helper.make_node("Constant", [], [y + ".scale"], value=onnx.numpy_helper.from_array(scale)),
                helper.make_node("Mul", [y + ".kept", y + ".scale"], [y]),
            ]
        if replaced:
            nodes = []
            for k, n in enumerate(proto.graph.node):
                nodes.extend(replaced[k] if k in replaced else [n])
            del proto.graph.node[:]
            proto.graph.node.extend(nodes)
        float_types = (TensorProto.FLOAT, TensorProto.DOUBLE)
        terms = []
        for o in proto.graph.output:
            if o.type.tensor_type.elem_type not in float_types:
                raise RuntimeError(f"output '{o.name}' is not float: kiln.torch differentiates float outputs")
            g = helper.make_tensor_value_info(o.name + ".grad_in", o.type.tensor_type.elem_type, None)
            g.type.tensor_type.shape.CopyFrom(o.type.tensor_type.shape)
            proto.graph.input.append(g)
            prod = o.name + ".vjp_product"
            proto.graph.node.append(helper.make_node("Mul", [o.name, o.name + ".grad_in"], [prod]))
            proto.graph.node.append(helper.make_node("ReduceSum", [prod], [prod + ".sum"], keepdims=0))
            terms.append(prod + ".sum")
        total = terms[0]
        for k, t in enumerate(terms[1:]):
            proto.graph.node.append(helper.make_node("Add", [total, t], [f"kiln.vjp.{k}"]))
            total = f"kiln.vjp.{k}"
        loss_type = proto.graph.output[0].type.tensor_type.elem_type
        del proto.graph.output[:]
        proto.graph.output.append(helper.make_tensor_value_info(total, loss_type, []))
        types = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
        self.wrt = [n for n in self.input_names
                    if types.get(n) in float_types and (n in user or state[n].requires_grad)]
        self.forward_model = _compile(forward, threads=threads, db=db)
        self.vjp_model = _compile(proto.SerializeToString(), threads=threads, db=db,
                                  gradient_of=total, gradient_wrt=self.wrt)
        infos = {o.name: o for o in self.forward_model.outputs}
        self.output_infos = [([int(d) for d in infos[n].dims], np.dtype(infos[n].dtype)) for n in self.outputs]

    def feeds(self, tensors):
        return {name: _numpy(t) for name, t in zip(self.input_names, tensors)}

    def update_running_statistics(self, state, outs):
        """Writes the forward's running statistics into the buffers, as PyTorch updates them: Kiln
        (ONNX) mixes in the batch's population variance, PyTorch its unbiased variance."""
        with _torch.no_grad():
            for mean_in, var_in, tracked, mean_out, var_out, count, momentum in self.running:
                var = state[var_in]
                new_var = _torch.from_numpy(np.array(outs[var_out]))
                if count > 1:
                    # m var + (1 - m) population  ->  m var + (1 - m) population count / (count - 1)
                    kept = momentum * var
                    new_var = kept + (new_var - kept) * (count / (count - 1))
                state[mean_in].copy_(_torch.from_numpy(np.array(outs[mean_out])))
                var.copy_(new_var)
                if tracked is not None:
                    state[tracked].add_(1)


class KilnModule(_torch.nn.Module):
    """`module` run by Kiln (see the module docstring). Its parameters are `module`'s."""

    def __init__(self, module, threads=0, db="", opset=17):
        super().__init__()
        self.module = module
        self._threads, self._db, self._opset = threads, db, opset
        self._built = {}

    def _state(self):
        tensors = dict(self.module.named_parameters())
        tensors.update(dict(self.module.named_buffers()))
        return tensors

    def forward(self, *inputs):
        training = self.module.training
        key = (training, tuple((tuple(t.shape), str(t.dtype)) if isinstance(t, _torch.Tensor) else repr(t)
                               for t in inputs))
        built = self._built.get(key)
        if built is None:
            built = _Built(self.module, inputs, self._threads, self._db, self._opset)
            self._built[key] = built
        state = self._state()
        tensors = list(inputs) + [state[n] for n in built.input_names[len(inputs):]]
        return _KilnFunction.apply(self, built, *tensors)
