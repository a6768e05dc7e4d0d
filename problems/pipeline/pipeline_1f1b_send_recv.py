"""One steady-state 1F1B pipeline step: activations to the next stage, gradients to the previous one."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "pipeline_1f1b_send_recv",
    "category": "pipeline",
    "source": {
        "codebase": "Megatron-LM",
        "path": "megatron/core/pipeline_parallel/p2p_communication.py",
        "symbol": "send_forward_backward_recv_forward_backward (_communicate, _batched_p2p_ops)",
    },
    "summary": (
        "Pipeline parallelism with the 1F1B schedule: ranks 0..W-1 are consecutive stages. In the steady "
        "state each stage sends the output activation of one micro-batch to the next stage and the input "
        "gradient of an earlier micro-batch to the previous stage, and receives the matching tensors from "
        "its neighbours, all in one batch_isend_irecv of P2POps (Megatron's _communicate with "
        "batch_p2p_comm). Inputs: output_tensor and input_tensor_grad, both [seq, micro_batch, hidden]. "
        "Outputs: (input_tensor received from stage r-1, output_tensor_grad received from stage r+1). "
        "The chain is not periodic: the first stage has no previous stage, so it sends no gradient and "
        "returns an empty [0, micro_batch, hidden] tensor as input_tensor; the last stage sends no "
        "activation and returns an empty [0, micro_batch, hidden] output_tensor_grad (Megatron returns "
        "None there). Default: a Llama-70B-sized activation (seq 4096, hidden 8192), 64 MiB each way; "
        "tp_sp is the same model with tensor-parallel size 4 and sequence parallelism (seq/4 per rank)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"seq": 4096, "micro_batch": 1, "hidden": 8192},
        "tp_sp": {"seq": 1024, "micro_batch": 1, "hidden": 8192},
        "small": {"seq": 8, "micro_batch": 2, "hidden": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"seq": 12, "micro_batch": 2, "hidden": 48},
        "default": {"seq": 3072, "micro_batch": 1, "hidden": 6144},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    size = (shape["seq"], shape["micro_batch"], shape["hidden"])
    output_tensor = torch.randn(size, generator=generator, device=device).to(torch.bfloat16)
    input_tensor_grad = torch.randn(size, generator=generator, device=device).mul_(1e-3).to(torch.bfloat16)
    return output_tensor, input_tensor_grad


@torch.no_grad()
def solution(output_tensor: torch.Tensor, input_tensor_grad: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    empty = output_tensor.new_empty((0, *output_tensor.shape[1:]))
    input_tensor = empty if first else torch.empty_like(output_tensor)
    output_tensor_grad = empty if last else torch.empty_like(output_tensor)
    ops = []  # Megatron's order: send_prev, recv_prev, send_next, recv_next
    if not first:
        ops.append(dist.P2POp(dist.isend, input_tensor_grad.contiguous(), rank - 1))
        ops.append(dist.P2POp(dist.irecv, input_tensor, rank - 1))
    if not last:
        ops.append(dist.P2POp(dist.isend, output_tensor.contiguous(), rank + 1))
        ops.append(dist.P2POp(dist.irecv, output_tensor_grad, rank + 1))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return input_tensor, output_tensor_grad


def oracle(shape, world_size, inputs_by_rank):
    out = []
    for r in range(world_size):
        act, grad = inputs_by_rank[r]
        empty = act.new_empty((0, *act.shape[1:]))
        from_prev = inputs_by_rank[r - 1][0].clone() if r > 0 else empty
        from_next = inputs_by_rank[r + 1][1].clone() if r < world_size - 1 else empty
        out.append((from_prev, from_next))
    return out
