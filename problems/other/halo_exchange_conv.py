"""Halo exchange for a conv2d on an image sharded along H, then the convolution of the padded slab."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "halo_exchange_conv",
    "category": "other",
    "source": {
        "codebase": "NVIDIA Apex",
        "path": "apex/contrib/bottleneck/halo_exchangers.py",
        "symbol": "HaloExchangerSendRecv.left_right_halo_exchange (used by HaloPadder / SpatialBottleneck)",
    },
    "summary": (
        "Spatial parallelism for convolutions on large images: each rank holds a slab of rows "
        "[N, C, H/W, Wd] of the activation (rank r has rows r*H/W..(r+1)*H/W). Before a k x k conv "
        "(stride 1, 'same' padding) every rank sends its first k//2 rows to rank r-1 and its last k//2 "
        "rows to rank r+1, receives the neighbours' boundary rows as halos, pads its slab with them and "
        "convolves. The chain is not periodic: as in Apex (left_zero on the first spatial rank, "
        "right_zero on the last), the outer halos of ranks 0 and W-1 are zeros, which equals zero "
        "padding of the whole image. Columns are zero-padded locally. The weight [C, C, k, k] is "
        "replicated. Output: this rank's rows of the conv, [N, C, H/W, Wd]. Default: a 3x3 conv with "
        "128 channels on two 512x512 feature maps (a ResNet bottleneck conv2 at high resolution)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 2, "channels": 128, "height": 512, "width": 512, "kernel": 3},
        "small": {"batch": 1, "channels": 8, "height": 32, "width": 16, "kernel": 3},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 2e-2, "rtol": 2e-2},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 3, "channels": 8, "height": 32, "width": 24, "kernel": 3},
        "default": {"batch": 3, "channels": 128, "height": 512, "width": 768, "kernel": 3},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    c, k = shape["channels"], shape["kernel"]
    x = torch.randn(shape["batch"], c, shape["height"] // world_size, shape["width"], generator=generator,
                    device=device)
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))  # the bare trial seed is rank 0's own
    weight = torch.randn(c, c, k, k, generator=shared, device=device) / (c * k * k) ** 0.5
    return x.to(torch.bfloat16), weight.to(torch.bfloat16)


@torch.no_grad()
def solution(x: torch.Tensor, weight: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    halo = weight.shape[-1] // 2
    top_halo = x.new_zeros(x.shape[0], x.shape[1], halo, x.shape[3])
    bottom_halo = torch.zeros_like(top_halo)
    ops = []
    if rank > 0:
        ops.append(dist.P2POp(dist.isend, x[:, :, :halo].contiguous(), rank - 1))
        ops.append(dist.P2POp(dist.irecv, top_halo, rank - 1))
    if rank < world - 1:
        ops.append(dist.P2POp(dist.isend, x[:, :, -halo:].contiguous(), rank + 1))
        ops.append(dist.P2POp(dist.irecv, bottom_halo, rank + 1))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    padded = torch.cat([top_halo, x, bottom_halo], dim=2)
    return F.conv2d(padded, weight, padding=(0, halo))


def oracle(shape, world_size, inputs_by_rank):
    image = torch.cat([inp[0] for inp in inputs_by_rank], dim=2).float()
    weight = inputs_by_rank[0][1].float()
    y = F.conv2d(image, weight, padding=shape["kernel"] // 2)
    return [rows.to(torch.bfloat16) for rows in y.chunk(world_size, dim=2)]
