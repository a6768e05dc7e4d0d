"""FSDP2 foreach_reduce: chunk-cat bf16 grads into an fp32 buffer, reduce-scatter (AVG), view out shards."""

import math

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "fsdp2_reduce_scatter_chunk_cat",
    "category": "fsdp_zero",
    "source": {
        "codebase": "PyTorch",
        "path": "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
        "symbol": "foreach_reduce / foreach_reduce_scatter_copy_in",
    },
    "summary": (
        "FSDP2's gradient reduction for one FSDPParamGroup (a Llama-style decoder layer plus a "
        "32001-row embedding) under MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32). "
        "Each rank holds full bf16 grads of its micro-batch. foreach_reduce_scatter_copy_in chunk-cats "
        "them (torch._chunk_cat) into one fp32 buffer viewed as [W, -1]: every grad's dim 0 is padded "
        "to a multiple of W and its i-th row chunk lands in row i (a widening bf16->fp32 cast on the "
        "way). _get_gradient_divide_factors picks no pre/post-divide and ReduceOp.AVG for fp32, so one "
        "reduce_scatter_tensor(AVG) produces this rank's flat shard, which is viewed out as each "
        "param's unpadded dim-0 shard (torch.chunk semantics: trailing ranks may get fewer rows). "
        "Outputs: the fp32 sharded grads."
    ),
    "dtype": "float32",
    "shapes": {
        "default": {"params": [[32001, 4096], [6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336],
                               [4096], [4096]]},
        "small": {"params": [[37, 16], [24, 16], [16, 16], [64, 16], [16, 56], [16], [29]]},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-5, "rtol": 1e-5},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"params": [[56, 16], [37, 16], [25, 16], [97, 16], [25, 56], [25], [44]]},
        "default": {
            "params": [[24000, 4096], [4608, 4096], [3072, 4096], [21504, 4096], [3072, 14336], [3072], [3072]],
        },
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    return tuple(
        torch.randn(s, generator=generator, device=device).to(torch.bfloat16) for s in shape["params"]
    )


@torch.no_grad()
def solution(*unsharded_grads):
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [-(-g.shape[0] // world) for g in unsharded_grads]
    inner = [math.prod(g.shape[1:]) for g in unsharded_grads]
    numel = sum(c * i for c, i in zip(chunks, inner)) * world
    rs_input = torch.empty(numel, dtype=torch.float32, device=unsharded_grads[0].device)
    torch._chunk_cat(list(unsharded_grads), dim=0, num_chunks=world, out=rs_input.view(world, -1))
    rs_output = rs_input.new_empty(numel // world)
    dist.reduce_scatter_tensor(rs_output, rs_input, op=dist.ReduceOp.AVG)
    sharded, offset = [], 0
    for g, c, i in zip(unsharded_grads, chunks, inner):
        rows = max(0, min(c, g.shape[0] - rank * c))
        sharded.append(rs_output[offset:offset + rows * i].view(rows, *g.shape[1:]))
        offset += c * i
    return tuple(sharded)


def oracle(shape, world_size, inputs_by_rank):
    n = len(shape["params"])
    mean = [sum(inputs[i].double() for inputs in inputs_by_rank) / world_size for i in range(n)]
    out = []
    for r in range(world_size):
        shards = []
        for m in mean:
            chunk = -(-m.shape[0] // world_size)
            shards.append(m[r * chunk:(r + 1) * chunk].float())
        out.append(tuple(shards))
    return out


def traffic(shape, world_size):
    """A direct reduce-scatter can ship the raw bf16 gradients and accumulate in fp32 at the owner; the
    reference upcasts first and moves fp32."""
    numel = sum(-(-s[0] // world_size) * math.prod(s[1:]) for s in shape["params"]) * world_size
    moved = (world_size - 1) * numel / world_size * 2
    return {"send_bytes": moved, "recv_bytes": moved}
