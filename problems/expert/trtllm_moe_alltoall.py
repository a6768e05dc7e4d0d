"""TensorRT-LLM wide-EP one-sided MoE all-to-all dispatch into per-source-rank [W, max_tokens] slots."""

import torch
import torch.distributed as dist

ZIPF = 0.2  # skew of the per-expert routing preference: the hottest expert gets ~2-5x the mean load
INVALID_EXPERT_ID = -1

PROBLEM = {
    "name": "trtllm_moe_alltoall",
    "category": "expert",
    "source": {
        "codebase": "TensorRT-LLM",
        "path": "tensorrt_llm/_torch/modules/fused_moe/communication/nvlink_one_sided.py",
        "symbol": "NVLinkOneSided.dispatch (torch.ops.trtllm.moe_a2a_dispatch + moe_a2a_sanitize_expert_ids)",
    },
    "summary": (
        "TensorRT-LLM's NVLink one-sided MoE all-to-all (wide expert parallelism with attention DP, "
        "DeepSeek-V3/R1: 256 experts, top-8, hidden 7168). Ranks hold different token counts "
        "(all_rank_num_tokens, known to all); each rank puts every token once into each rank hosting "
        "one of its top-k experts (target rank = expert // experts_per_rank), together with its payloads "
        "token_selected_slots [tokens, k] int32 (global expert ids, not remapped) and token_final_scales "
        "[tokens, k] fp32. The receive buffers are [W, max_tokens, ...] with max_tokens = "
        "max(all_rank_num_tokens), flattened to [W * max_tokens, ...]: source rank s owns rows "
        "[s*max_tokens, s*max_tokens + n_s), filled in ascending source-token order (the kernel's slot "
        "order comes from atomics; this is the deterministic choice). Unused rows are sanitized: expert "
        "ids -1 (moe_a2a_sanitize_expert_ids), and here hidden states and scales are 0 so the output is "
        "fully defined. Outputs: hidden [W*max_tokens, hidden] bf16, slots [W*max_tokens, k] int32, "
        "scales [W*max_tokens, k] fp32, and recv_counts [W] int32 (rows received per source)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"tokens": 256, "hidden": 7168, "experts": 256, "topk": 8},  # per-rank max, decode
        "prefill": {"tokens": 2048, "hidden": 7168, "experts": 256, "topk": 8},
        "small": {"tokens": 16, "hidden": 32, "experts": 8, "topk": 2},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},  # copied, not computed
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"tokens": 24, "hidden": 48, "experts": 8, "topk": 2},
        "default": {"tokens": 192, "hidden": 5376, "experts": 256, "topk": 8},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    t, h, e, k = shape["tokens"], shape["hidden"], shape["experts"], shape["topk"]
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))
    bias = -ZIPF * torch.log1p(torch.randperm(e, generator=shared, device=device).float())
    # attention-DP ranks carry uneven batches; every rank knows all counts
    all_rank_num_tokens = torch.randint(t // 2, t + 1, (world_size,), generator=shared, device=device)
    all_rank_num_tokens = all_rank_num_tokens.tolist()
    n = all_rank_num_tokens[rank]
    top_logits, topk_idx = (torch.randn(n, e, generator=generator, device=device) + bias).topk(k, dim=-1)
    hidden = torch.randn(n, h, generator=generator, device=device).to(torch.bfloat16)
    return hidden, topk_idx.int(), top_logits.softmax(dim=-1), all_rank_num_tokens, e


@torch.no_grad()
def solution(
    hidden_states: torch.Tensor,
    token_selected_slots: torch.Tensor,
    token_final_scales: torch.Tensor,
    all_rank_num_tokens: list,
    num_slots: int,
):
    world_size = dist.get_world_size()
    experts_per_rank = num_slots // world_size
    max_tokens = max(all_rank_num_tokens)
    num_tokens = hidden_states.shape[0]
    device = hidden_states.device

    target = token_selected_slots.long() // experts_per_rank
    is_token_in_rank = torch.zeros(num_tokens, world_size, dtype=torch.bool, device=device)
    is_token_in_rank.scatter_(1, target, True)
    dst, src_token = is_token_in_rank.T.nonzero(as_tuple=True)  # grouped by target rank, tokens ascending
    send_counts = is_token_in_rank.sum(dim=0).int()
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_sizes, recv_sizes = send_counts.tolist(), recv_counts.tolist()

    # each source's rows land at the front of its [max_tokens] block
    slot = torch.cat([torch.arange(n, device=device) + s * max_tokens for s, n in enumerate(recv_sizes)])

    def dispatch(payload: torch.Tensor, fill) -> torch.Tensor:
        received = payload.new_empty(sum(recv_sizes), *payload.shape[1:])
        dist.all_to_all_single(received, payload[src_token].contiguous(), recv_sizes, send_sizes)
        out = payload.new_full((world_size * max_tokens, *payload.shape[1:]), fill)
        out[slot] = received
        return out

    hidden_recv = dispatch(hidden_states, 0.0)
    slots_recv = dispatch(token_selected_slots, INVALID_EXPERT_ID)
    scales_recv = dispatch(token_final_scales, 0.0)
    return hidden_recv, slots_recv, scales_recv, recv_counts


def oracle(shape, world_size, inputs_by_rank):
    h, e, k = shape["hidden"], shape["experts"], shape["topk"]
    per_rank = e // world_size
    max_tokens = max(inputs_by_rank[0][3])
    outs = []
    for r in range(world_size):
        hid = torch.zeros(world_size * max_tokens, h, dtype=torch.bfloat16)
        slots = torch.full((world_size * max_tokens, k), INVALID_EXPERT_ID, dtype=torch.int32)
        scales = torch.zeros(world_size * max_tokens, k)
        counts = []
        for s, (hidden, sel, fs, _, _) in enumerate(inputs_by_rank):
            row = s * max_tokens
            for t in range(hidden.shape[0]):
                if r in {int(g) // per_rank for g in sel[t]}:
                    hid[row], slots[row], scales[row] = hidden[t], sel[t], fs[t]
                    row += 1
            counts.append(row - s * max_tokens)
        outs.append((hid, slots, scales, torch.tensor(counts, dtype=torch.int32)))
    return outs
