"""ONNX's standard training form (ModelProto.training_info with the ai.onnx.preview.training
ops) in `kiln train`:

- a model written by hand with onnx.helper (a loss, Gradient, Momentum with Nesterov and L2
  decay, the step count bound to its increment) trains by its own algorithm and follows
  PyTorch's SGD step for step; the inference model it exports holds PyTorch's weights; the
  training-form model it exports holds the state reached and continues where PyTorch does;
- Kiln's own steps (SGD with momentum, AdamW with clipping, BatchNormalization's running
  statistics) exported in the training form pass the ONNX checker, and training that file by its
  own algorithm continues exactly as the uninterrupted Kiln run;
- an initialization graph runs once before the first step (training starts from its values);
- malformed training forms (a binding to a non-initializer, a name the model has too, a
  Gradient fed another value, an initialization graph reading the model, two algorithms) are
  clear errors.

    PYTHONPATH=build/python run_onnx_training_form_test.py --kiln build/bin/kiln
"""
import argparse
import io
import os
import re
import subprocess
import tempfile

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln
from cases import case, finish

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--kiln", required=True)
ARGS = PARSER.parse_args()

TRAINING = "ai.onnx.preview.training"


def run_kiln(*args, check=True):
    r = subprocess.run([ARGS.kiln, *args], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def losses(stdout):
    return [float(v) for v in re.findall(r"step \d+ loss (\S+)", stdout)]


def write_batches(directory, batches):
    for b, feeds in enumerate(batches):
        d = os.path.join(directory, f"batch_{b}")
        os.makedirs(d)
        for name, value in feeds.items():
            np.save(os.path.join(d, name + ".npy"), value)
    return directory


def mlp_weights(seed):
    rng = np.random.default_rng(seed)
    return {"W1": (rng.standard_normal((5, 8)) * 0.5).astype(np.float32),
            "b1": (rng.standard_normal(8) * 0.1).astype(np.float32),
            "W2": (rng.standard_normal((8, 3)) * 0.5).astype(np.float32),
            "b2": (rng.standard_normal(3) * 0.1).astype(np.float32)}


def mlp_graph(weights):
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Tanh", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "W2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["y"])]
    return helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                             [numpy_helper.from_array(w, n) for n, w in weights.items()])


def hand_algorithm(names, lr, momentum, decay):
    """MSE against input t; Gradient over `names`; one Momentum node (Nesterov); T += 1."""
    nodes = [helper.make_node("Sub", ["y", "t"], ["d"]), helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["loss"], keepdims=0),
             helper.make_node("Gradient", names, [n + "_g" for n in names], domain=TRAINING, xs=names, y="loss"),
             helper.make_node("Momentum", ["R", "T"] + names + [n + "_g" for n in names] + [n + "_v" for n in names],
                              [n + "_new" for n in names] + [n + "_v_new" for n in names], domain=TRAINING,
                              alpha=momentum, beta=1.0, mode="nesterov", norm_coefficient=decay),
             helper.make_node("Add", ["T", "one"], ["T_new"])]
    initializers = [numpy_helper.from_array(np.array(lr, np.float32), "R"),
                    numpy_helper.from_array(np.array(0, np.int64), "T"),
                    numpy_helper.from_array(np.array(1, np.int64), "one")]
    return nodes, initializers


def hand_model(weights, lr=0.05, momentum=0.9, decay=0.01, edit=None):
    names = list(weights)
    nodes, initializers = hand_algorithm(names, lr, momentum, decay)
    initializers += [numpy_helper.from_array(np.zeros_like(w), n + "_v") for n, w in weights.items()]
    outputs = ["loss"] + [n + "_new" for n in names] + [n + "_v_new" for n in names] + ["T_new"]
    algorithm = helper.make_graph(nodes, "sgd", [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 3])],
                                  [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
                                  initializers)
    info = onnx.TrainingInfoProto()
    info.algorithm.CopyFrom(algorithm)
    for n in names:
        info.update_binding.add(key=n, value=n + "_new")
        info.update_binding.add(key=n + "_v", value=n + "_v_new")
    info.update_binding.add(key="T", value="T_new")
    model = helper.make_model(mlp_graph(weights), opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid(TRAINING, 1)])
    model.training_info.append(info)
    if edit:
        edit(model)
    return model


def mlp_batches(seed, count):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 5)).astype(np.float32),
             "t": rng.standard_normal((4, 3)).astype(np.float32)} for _ in range(count)]


def torch_mlp_run(weights, batches, lr=0.05, momentum=0.9, decay=0.01, optimizer=None):
    params = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
    opt = optimizer or torch.optim.SGD(params.values(), lr=lr, momentum=momentum, nesterov=True, weight_decay=decay)
    out = []
    for b in batches:
        opt.zero_grad()
        h = torch.tanh(torch.from_numpy(b["x"]) @ params["W1"] + params["b1"])
        y = h @ params["W2"] + params["b2"]
        loss = ((y - torch.from_numpy(b["t"])) ** 2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, {n: p.detach().numpy().copy() for n, p in params.items()}, opt


def onnx_weight(path, name):
    return next(numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer if i.name == name)


def close(a, b, rtol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.abs(b).max(), 1e-3)
    return np.abs(a - b).max() <= rtol * scale


@case
def hand_written_algorithm_follows_pytorch():
    weights = mlp_weights(3)
    batches = mlp_batches(4, 6)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "mlp_train.onnx")
        m = hand_model(weights)
        onnx.checker.check_model(m)
        onnx.save(m, model)
        first = write_batches(os.path.join(tmp, "first"), batches[:4])
        later = write_batches(os.path.join(tmp, "later"), batches[4:])
        trained, cont = os.path.join(tmp, "trained.onnx"), os.path.join(tmp, "cont.onnx")
        r = run_kiln("train", model, "--data", first, "--threads", "2", "-o", trained, "--export-training", cont)
        ref_losses, ref_weights, opt = torch_mlp_run(weights, batches[:4])
        got = losses(r.stdout)
        # kiln.Trainer on the same file: its own algorithm, the same compiled step, the same losses.
        trainer = kiln.Trainer(model, threads=2)
        assert sorted(trainer.params) == sorted(weights), trainer.params
        assert [f"{trainer.step(b):.9g}" for b in batches[:4]] == [f"{v:.9g}" for v in got]
        assert int(trainer.state["T"]) == 4 and np.array_equal(trainer.params["W1"], onnx_weight(trained, "W1"))
        assert len(got) == 4 and np.std(got) > 1e-3, r.stdout
        assert close(got, ref_losses, 1e-5), (got, ref_losses)
        # The inference model: no training form, PyTorch's weights.
        inference = onnx.load(trained)
        assert len(inference.training_info) == 0
        assert TRAINING not in [o.domain for o in inference.opset_import]
        stored = {i.name: numpy_helper.to_array(i) for i in inference.graph.initializer}
        for n, w in ref_weights.items():
            assert close(stored[n], w, 1e-5), n
        # The training form: the state reached; continuing it continues PyTorch's run.
        saved = onnx.load(cont)
        assert len(saved.training_info) == 1
        state = {i.name: numpy_helper.to_array(i) for i in saved.training_info[0].algorithm.initializer}
        assert int(state["T"]) == 4, state["T"]
        r2 = run_kiln("train", cont, "--data", later, "--threads", "2")
        params = list(opt.param_groups[0]["params"])
        for p, (n, w) in zip(params, ref_weights.items()):
            assert np.array_equal(p.detach().numpy(), w), n
        ref2 = []
        for b in batches[4:]:
            opt.zero_grad()
            h = torch.tanh(torch.from_numpy(b["x"]) @ params[0] + params[1])
            loss = (((h @ params[2] + params[3]) - torch.from_numpy(b["t"])) ** 2).mean()
            loss.backward()
            opt.step()
            ref2.append(loss.item())
        assert close(losses(r2.stdout), ref2, 1e-5), (r2.stdout, ref2)


@case
def initialization_graph_runs_before_the_first_step():
    weights = mlp_weights(3)
    batches = mlp_batches(4, 3)
    start = dict(weights)
    start["W1"] = (np.random.default_rng(9).standard_normal((5, 8)) * 0.3).astype(np.float32)
    start["b2"] = np.array([0.5, -0.25, 0.125], np.float32) * 2

    def initialization(m):
        nodes = [helper.make_node("Constant", [], ["W1_init"], value=numpy_helper.from_array(start["W1"])),
                 helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(start["b2"] / 2)),
                 helper.make_node("Add", ["half", "half"], ["b2_init"])]
        init = helper.make_graph(nodes, "init", [], [
            helper.make_tensor_value_info("W1_init", TensorProto.FLOAT, [5, 8]),
            helper.make_tensor_value_info("b2_init", TensorProto.FLOAT, [3])])
        m.training_info[0].initialization.CopyFrom(init)
        m.training_info[0].initialization_binding.add(key="W1", value="W1_init")
        m.training_info[0].initialization_binding.add(key="b2", value="b2_init")

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "init.onnx")
        m = hand_model(weights, edit=initialization)
        onnx.checker.check_model(m)
        onnx.save(m, model)
        data = write_batches(os.path.join(tmp, "d"), batches)
        cont = os.path.join(tmp, "cont.onnx")
        got = losses(run_kiln("train", model, "--data", data, "--threads", "2", "--export-training", cont).stdout)
        ref, _, _ = torch_mlp_run(start, batches)
        assert close(got, ref, 1e-5), (got, ref)
        trainer = kiln.Trainer(model, threads=2)
        assert [f"{trainer.step(b):.9g}" for b in batches] == [f"{v:.9g}" for v in got]
        assert not close(got, torch_mlp_run(weights, batches)[0], 1e-3), "the initialization graph changed nothing"
        # Run once: the training form written afterwards holds the state, not the initialization graph.
        assert not onnx.load(cont).training_info[0].HasField("initialization")


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def cnn_model(tmp):
    torch.manual_seed(5)
    net = SmallCNN()
    net.train()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(4, 2, 6, 6),), buf, input_names=["x"], output_names=["logits"],
                      opset_version=17, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    path = os.path.join(tmp, "cnn.onnx")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    rng = np.random.default_rng(8)
    batches = [{"x": rng.standard_normal((4, 2, 6, 6)).astype(np.float32),
                "target": rng.integers(0, 3, 4).astype(np.int64)} for _ in range(4)]
    return path, batches


@case
def kiln_steps_exported_continue_alike():
    with tempfile.TemporaryDirectory() as tmp:
        model, batches = cnn_model(tmp)
        first = write_batches(os.path.join(tmp, "first"), batches[:2])
        later = write_batches(os.path.join(tmp, "later"), batches[2:])
        every = write_batches(os.path.join(tmp, "every"), batches)
        for name, flags, ops in [
                ("momentum", ["--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.01"],
                 {"Gradient", "Momentum"}),
                ("adamw", ["--optimizer", "adamw", "--weight-decay", "0.01", "--clip-norm", "0.5"], {"Gradient"})]:
            common = ["--loss", "cross-entropy", "--lr", "0.01", "--threads", "2", *flags]
            whole = losses(run_kiln("train", model, "--data", every, *common).stdout)
            exported = os.path.join(tmp, name + ".onnx")
            run_kiln("train", model, "--data", first, *common, "--export-training", exported)
            m = onnx.load(exported)
            onnx.checker.check_model(m)
            info = m.training_info[0]
            assert {n.op_type for n in info.algorithm.node if n.domain == TRAINING} == ops, name
            bound = {e.key for e in info.update_binding}
            params = {i.name for i in m.graph.initializer if i.name.startswith(("conv", "bn.weight", "bn.bias", "fc"))}
            running = {i.name for i in m.graph.initializer if "running" in i.name}
            assert params and running and params | running | {"kiln.iterations"} <= bound, (bound, params, running)
            state = {i.name: numpy_helper.to_array(i) for i in info.algorithm.initializer}
            assert int(state["kiln.iterations"]) == 2, name
            # Trained by the file's own algorithm (no loss or optimizer option): the same later losses.
            later_losses = losses(run_kiln("train", exported, "--data", later, "--lr", "0.01", "--threads", "2").stdout)
            assert len(whole) == 4 and np.std(whole) > 1e-4, whole
            assert close(later_losses, whole[2:], 1e-5), (name, later_losses, whole)


def expect_error(tmp, model, *fragments):
    path = os.path.join(tmp, "bad.onnx")
    onnx.save(model, path)
    data = write_batches(os.path.join(tmp, f"data_{len(os.listdir(tmp))}"), mlp_batches(1, 1))
    r = run_kiln("train", path, "--data", data, check=False)
    assert r.returncode == 2, (r.returncode, r.stderr)
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


@case
def malformed_training_forms_are_errors():
    weights = mlp_weights(1)

    def bind_to_value(m):
        m.training_info[0].update_binding.add(key="h1", value="loss")

    def clash(m):
        m.training_info[0].algorithm.node[0].output[0] = "h"
        m.training_info[0].algorithm.node[1].input[:] = ["h", "h"]

    def fed_other(m):
        m.training_info[0].algorithm.node[3].input[0] = "W2"

    def initialization_reads_model(m):
        init = helper.make_graph([helper.make_node("Neg", ["W1"], ["W1_init"])], "init", [],
                                 [helper.make_tensor_value_info("W1_init", TensorProto.FLOAT, [5, 8])])
        m.training_info[0].initialization.CopyFrom(init)
        m.training_info[0].initialization_binding.add(key="W1", value="W1_init")

    def two(m):
        m.training_info.append(m.training_info[0])

    with tempfile.TemporaryDirectory() as tmp:
        expect_error(tmp, hand_model(weights, edit=bind_to_value), "training_info[0].update_binding", "'h1'",
                     "not an initializer")
        expect_error(tmp, hand_model(weights, edit=clash), "training_info[0]", "'h'")
        expect_error(tmp, hand_model(weights, edit=fed_other), "Gradient", "not 'W1' itself")
        expect_error(tmp, hand_model(weights, edit=initialization_reads_model), "initialization graph reads",
                     "'W1'")
        expect_error(tmp, hand_model(weights, edit=two), "2 training algorithms")


finish()
