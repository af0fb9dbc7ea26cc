"""The KL term's reference weights (rl/reference.py) on FSDP2 parameters: a one-rank gloo process group on the CPU
(its parameters are DTensors, as on one GPU with bf16), in a subprocess so this test's process group stays its own.
Inside the swap the module computes with the start weights; afterwards with its own, bit for bit. The actor's use of
it (the reference log-probs, the KL metric, an exact resume) is tests/test_rl_actor.py's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from rlinf_cosmos3.rl.reference import ReferenceWeights

SCRIPT = textwrap.dedent("""
    import os, socket
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from rlinf_cosmos3.rl.reference import ReferenceWeights

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model[2].weight.requires_grad_(False)  # a frozen part: shared, not copied
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    x = torch.randn(3, 4)
    reference = ReferenceWeights(model)
    assert reference.num_elements == 4 * 8 + 8 + 1
    with torch.no_grad():
        start = model(x)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(x).sum().backward()
    optimizer.step()
    with torch.no_grad():
        trained = model(x)  # a forward after the step: gathered parameters may linger
    with reference.swapped():
        at_start = model(x)
    with torch.no_grad():
        after = model(x)
    assert not torch.equal(start, trained)
    assert torch.equal(at_start, start) and torch.equal(after, trained)
    dist.destroy_process_group()
    print("ok")
""")


def test_the_swap_restores_fsdp2_shards_exactly() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.stdout + proc.stderr)[-3000:]


def test_plain_parameters_and_bad_inputs() -> None:
    model = torch.nn.Linear(3, 2)
    reference = ReferenceWeights(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    moved = {k: v.clone() for k, v in model.state_dict().items()}
    with reference.swapped():
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert not torch.is_grad_enabled()
    assert all(torch.equal(v, moved[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="inside"), reference.swapped():
        raise RuntimeError("inside")  # an error in the block still restores the weights
    assert all(torch.equal(v, moved[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="no trainable parameter"):
        ReferenceWeights(torch.nn.Linear(2, 2).requires_grad_(False))
