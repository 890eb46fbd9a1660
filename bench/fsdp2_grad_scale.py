"""Why torch's floor is 2.9: FSDP2 on gloo (CPU) sums gradients over ranks in torch 2.7 and 2.8 instead of
averaging them. Two ranks, each with half of a batch, against one process with the whole batch:

    python -m torch.distributed.run --nproc_per_node=2 bench/fsdp2_grad_scale.py

prints ``grad ratio FSDP2 / one process: 1.0`` on torch >= 2.9 (2.0 on 2.7 and 2.8). Figures: bench/RESULTS.md.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
sharded, whole = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
whole.load_state_dict(sharded.state_dict())
x = torch.randn(4, 4)
fully_shard(sharded, mesh=init_device_mesh("cpu", (2,)))
sharded(x[2 * rank:2 * rank + 2]).pow(2).mean().backward()
whole(x).pow(2).mean().backward()
ratio = (sharded.weight.grad.full_tensor() / whole.weight.grad).mean().item()
if rank == 0:
    print(f"torch {torch.__version__}: grad ratio FSDP2 / one process: {ratio:.3f}")
dist.destroy_process_group()
