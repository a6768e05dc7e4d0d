"""vLLM pipeline hand-off of TP-replicated tensors: send a 1/TP slice, all-gather it on the next stage."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "tp_sliced_send_all_gather",
    "category": "pipeline",
    "source": {
        "codebase": "vLLM",
        "path": "vllm/distributed/parallel_state.py",
        "symbol": "GroupCoordinator.send_tensor_dict / recv_tensor_dict (all_gather_group=get_tp_group())",
    },
    "summary": (
        "Pipeline-parallel inference with tensor parallelism inside each stage. The intermediate tensors "
        "a stage hands to the next (hidden_states and residual, [tokens, hidden]) are identical on every "
        "TP rank of the stage, so vLLM's send_tensor_dict with all_gather_group sends only slice t of "
        "tensor.reshape(TP, -1) from TP rank t to TP rank t of the next stage, and recv_tensor_dict "
        "all-gathers the slices over the receiving TP group. Layout: W ranks = 2 stages x TP = W/2; rank "
        "r is stage r // TP, TP rank r % TP. Every stage hands its tensors to the next one, the last "
        "wrapping to the first (vLLM's default dst = (rank_in_group + 1) % world_size), as in a steady "
        "state with two micro-batches in flight, so every rank sends and receives. Each rank returns the "
        "(hidden_states, residual) it receives. The reference builds its TP subgroups once (module-level "
        "cache keyed by the default group; every rank calls new_group for every group in the same "
        "order). Default: a prefill chunk of 4096 tokens, hidden 8192; decode: 256 tokens."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 4096, "hidden": 8192},
        "decode": {"tokens": 256, "hidden": 8192},
        "small": {"tokens": 8, "hidden": 64},
    },
    "world_sizes": [4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 12, "hidden": 96},
        "default": {"tokens": 3072, "hidden": 6144},
    },
}

STAGES = 2


def make_inputs(shape, rank, world_size, generator, device):
    # Replicated within a TP group: draw every stage's tensors from a trial-wide generator, keep ours.
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    size = (shape["tokens"], shape["hidden"])
    stage = rank // (world_size // STAGES)
    drawn = [
        (torch.randn(size, generator=shared, device=device), torch.randn(size, generator=shared, device=device))
        for _ in range(STAGES)
    ]
    hidden_states, residual = drawn[stage]
    return hidden_states.to(torch.bfloat16), residual.to(torch.bfloat16)


_TP_GROUPS: dict = {}


def _tp_group(world: int):
    key = dist.group.WORLD
    if key not in _TP_GROUPS:
        tp = world // STAGES
        groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(STAGES)]
        _TP_GROUPS[key] = groups[dist.get_rank() // tp]
    return _TP_GROUPS[key]


@torch.no_grad()
def solution(hidden_states: torch.Tensor, residual: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // STAGES
    group = _tp_group(world)
    t = rank % tp
    dst, src = (rank + tp) % world, (rank - tp) % world
    outs = []
    for tensor in (hidden_states, residual):
        piece = tensor.reshape(tp, -1)[t].contiguous()
        recv = torch.empty_like(piece)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, piece, dst), dist.P2POp(dist.irecv, recv, src)])
        for req in reqs:
            req.wait()
        full = torch.empty(tp * piece.numel(), dtype=piece.dtype, device=piece.device)
        dist.all_gather_into_tensor(full, recv, group=group)
        outs.append(full.view_as(tensor))
    return tuple(outs)


def oracle(shape, world_size, inputs_by_rank):
    tp = world_size // STAGES
    # TP rank 0 of the previous stage holds the same tensors as every rank of that stage.
    return [tuple(x.clone() for x in inputs_by_rank[((r // tp - 1) % STAGES) * tp]) for r in range(world_size)]
