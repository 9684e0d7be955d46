"""PyTorch integration: `kiln.torch.compile(module, example_inputs)` returns an nn.Module whose
forward and backward run in Kiln, for an ordinary PyTorch training loop with any optimizer.

On the first call the module is exported to ONNX with its parameters and buffers as graph
inputs, and compiled twice: the forward, and its vector-Jacobian product (the backward: the
gradient of sum_k <output_k, grad_k> with respect to the inputs and parameters, by Kiln's
reverse mode over the graph, `docs/training.md`). The parameters stay PyTorch's: the optimizer
updates them, and each call reads them as they are (numpy views of the tensors, no copy).
Outputs come back as tensors over Kiln's buffers (no copy). The backward recomputes the forward
inside the compiled VJP graph. The module is exported in eval form (Dropout and
BatchNormalization as in inference), and with the input shapes of the first call.
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
    def forward(ctx, owner, *tensors):
        outs = owner._forward_model.run(owner._feeds(tensors))
        ctx.owner = owner
        ctx.save_for_backward(*tensors)
        results = tuple(_torch.from_numpy(outs[name]) for name in owner._outputs)
        return results if len(results) > 1 else results[0]

    @staticmethod
    def backward(ctx, *grads):
        owner = ctx.owner
        tensors = ctx.saved_tensors
        feeds = owner._feeds(tensors)
        for name, g, info in zip(owner._outputs, grads, owner._output_infos):
            feeds[name + ".grad_in"] = (np.zeros(info[0], info[1]) if g is None else _numpy(g))
        outs = owner._vjp_model.run(feeds)
        result = [None]  # owner
        for name in owner._input_names:
            result.append(_torch.from_numpy(outs[name + "_grad"]) if name in owner._wrt else None)
        return tuple(result)


class KilnModule(_torch.nn.Module):
    """`module` run by Kiln (see the module docstring). Its parameters are `module`'s."""

    def __init__(self, module, threads=0, db="", opset=17):
        super().__init__()
        self.module = module
        self._threads, self._db, self._opset = threads, db, opset
        self._forward_model = None

    def _state(self):
        tensors = dict(self.module.named_parameters())
        tensors.update(dict(self.module.named_buffers()))
        return tensors

    def _feeds(self, tensors):
        return {name: _numpy(t) for name, t in zip(self._input_names, tensors)}

    def _build(self, inputs):
        import onnx
        from onnx import TensorProto, helper

        user = [f"input_{i}" for i in range(len(inputs))]
        buf = io.BytesIO()
        with _torch.no_grad():
            _torch.onnx.export(self.module, tuple(inputs), buf, input_names=user, export_params=False,
                               do_constant_folding=False, opset_version=self._opset)
        proto = onnx.load_from_string(buf.getvalue())
        state = self._state()
        extra = [i.name for i in proto.graph.input[len(user):]]
        unknown = [n for n in extra if n not in state]
        if unknown:
            raise RuntimeError(f"the exported model takes inputs {unknown} that are not the module's "
                               "parameters or buffers")
        self._input_names = user + extra
        self._outputs = [o.name for o in proto.graph.output]
        forward = proto.SerializeToString()

        # The VJP graph: a grad input per output, the scalar sum_k <output_k, grad_k>.
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
        self._wrt = [n for n in self._input_names
                     if types.get(n) in float_types and (n in user or state[n].requires_grad)]
        self._forward_model = _compile(forward, threads=self._threads, db=self._db)
        self._vjp_model = _compile(proto.SerializeToString(), threads=self._threads, db=self._db,
                                   gradient_of=total, gradient_wrt=self._wrt)
        infos = {o.name: o for o in self._forward_model.outputs}
        self._output_infos = [([int(d) for d in infos[n].dims], np.dtype(infos[n].dtype)) for n in self._outputs]

    def forward(self, *inputs):
        if self._forward_model is None:
            self._build(inputs)
        state = self._state()
        tensors = list(inputs) + [state[n] for n in self._input_names[len(inputs):]]
        return _KilnFunction.apply(self, *tensors)
