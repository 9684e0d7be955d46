"""A kiln.torch module under PyTorch's DistributedDataParallel (gloo, two processes on this
machine, each on its half of every batch) against one process on the whole batches: the loss
is a mean, DDP averages the gradients, so every rank's final parameters must equal the single
process's (and differ from the initial ones).

    PYTHONPATH=build/python run_kiln_torch_ddp_test.py
"""
import copy
import os
import socket
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kiln.torch
from cases import case, finish

STEPS = 4


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def data():
    gen = torch.Generator().manual_seed(11)
    return [(torch.randn(8, 8, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(STEPS)]


def train(model, batches, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for x, t in batches:
        opt.zero_grad()
        loss = ((model(x) - t) ** 2).mean()
        loss.backward()
        opt.step()


def rank_main(rank, world, port, init, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net()
    model.load_state_dict(init)
    ddp = torch.nn.parallel.DistributedDataParallel(kiln.torch.compile(model, threads=1))
    half = [(x[rank * 4:(rank + 1) * 4], t[rank * 4:(rank + 1) * 4]) for x, t in data()]
    train(ddp, half)
    torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_parallel_matches_one_process():
    torch.manual_seed(0)
    init = Net().state_dict()
    single = Net()
    single.load_state_dict(copy.deepcopy(init))
    train(single, data())
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(2, free_port(), init, out), nprocs=2, join=True)
        for rank in (0, 1):
            got = torch.load(os.path.join(out, f"rank{rank}.pt"))
            for name, want in single.state_dict().items():
                assert not torch.equal(want, init[name]), f"{name} did not train"
                np.testing.assert_allclose(got[name].numpy(), want.numpy(), rtol=1e-4,
                                           atol=1e-5 * float(want.abs().max()), err_msg=f"rank {rank} {name}")


if __name__ == "__main__":
    # Cases run here, not at import: the spawned ranks import this file again.
    case(data_parallel_matches_one_process)
    finish()
