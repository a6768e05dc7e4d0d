"""CLIP contrastive loss with embeddings sharded over ranks: all-gather, then each rank's local loss."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBLEM = {
    "name": "sharded_contrastive_loss",
    "category": "other",
    "source": {
        "codebase": "OpenCLIP",
        "path": "src/open_clip/loss.py",
        "symbol": "ClipLoss.forward with gather_features (local_loss=True, gather_with_grad=True)",
    },
    "summary": (
        "Data-parallel CLIP training: each rank holds the L2-normalised image and text embeddings of its "
        "B samples ([B, D] each). OpenCLIP's ClipLoss all-gathers both across ranks and, with "
        "local_loss=True (the setting for large runs), computes only the rows of its own samples: "
        "logits_per_image = s * img_local @ all_text.T and logits_per_text = s * text_local @ all_img.T "
        "([B, W*B], fp32), labels arange(B) + B*rank, loss = (CE(logits_per_image) + "
        "CE(logits_per_text)) / 2. Forward only. Inputs: image and text embeddings (bf16; the text "
        "embedding is a noisy copy of the image one so positives stand out) and logit_scale (a "
        "1-element fp32 tensor, the same on every rank). Output: this rank's local loss as a 1-element "
        "fp32 tensor (ranks differ; OpenCLIP backpropagates each rank's own). Default: 1024 samples per "
        "rank, embedding dim 1024 (ViT-H/14)."
    ),
    "dtype": "bfloat16",
    "shapes": {
        "default": {"batch": 1024, "dim": 1024},
        "small": {"batch": 8, "dim": 32},
    },
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 1e-3, "rtol": 1e-3},
    "held_out": {  # scored at the end, never used by the tools: same meaning, other sizes
        "small": {"batch": 12, "dim": 48},
        "default": {"batch": 768, "dim": 768},
    },
}


def make_inputs(shape, rank, world_size, generator, device):
    b, d = shape["batch"], shape["dim"]
    image = F.normalize(torch.randn(b, d, generator=generator, device=device), dim=-1)
    text = F.normalize(image + 0.05 * torch.randn(b, d, generator=generator, device=device), dim=-1)
    shared = torch.Generator(device=device)
    shared.manual_seed(generator.initial_seed() - rank + (1 << 15))  # the bare trial seed is rank 0's own
    logit_scale = 10 + 90 * torch.rand(1, generator=shared, device=device)  # exp(learned log-scale), max 100
    return image.to(torch.bfloat16), text.to(torch.bfloat16), logit_scale


@torch.no_grad()
def solution(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    b = image_features.shape[0]
    all_image = image_features.new_empty((world * b, image_features.shape[1]))
    all_text = torch.empty_like(all_image)
    dist.all_gather_into_tensor(all_image, image_features.contiguous())
    dist.all_gather_into_tensor(all_text, text_features.contiguous())
    logits_per_image = logit_scale * image_features.float() @ all_text.float().t()
    logits_per_text = logit_scale * text_features.float() @ all_image.float().t()
    labels = torch.arange(b, device=image_features.device) + b * rank
    loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
    return loss.reshape(1)


def oracle(shape, world_size, inputs_by_rank):
    images = torch.cat([inp[0] for inp in inputs_by_rank]).double()
    texts = torch.cat([inp[1] for inp in inputs_by_rank]).double()
    scale = inputs_by_rank[0][2].double()
    logits = scale * images @ texts.t()  # [image i, text j] over the global batch
    diag = logits.diagonal()
    image_terms = torch.logsumexp(logits, dim=1) - diag
    text_terms = torch.logsumexp(logits, dim=0) - diag
    b = shape["batch"]
    return [((image_terms[r * b:(r + 1) * b].mean() + text_terms[r * b:(r + 1) * b].mean()) / 2).reshape(1).float()
            for r in range(world_size)]
