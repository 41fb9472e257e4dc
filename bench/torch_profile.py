#!/usr/bin/env python3
"""Where PyTorch's ResNet-50 training step spends its GPU time: torch.profiler over a few eager
steps (the settings of bench/cuda_torch_baseline.py: float32, TF32 off, cudnn.benchmark off,
SGD with momentum, cross-entropy), summed by kernel like bench/kernel_profile.py sums Tessera's,
so that the two kernel mixes can be set side by side. Run on the GPU machine (bench/device_check.sh
part torch_profile).

  python3 bench/torch_profile.py [batch=8] [steps=5]
"""
import sys

import torch
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def main():
    images = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(dev)
    x = torch.randn(images, 3, 224, 224, device=dev)
    labels = torch.arange(images, device=dev) % 1000
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    # The table of key_averages (kernels are rows of their own), sorted by GPU time (the sort
    # key was renamed from cuda to device in PyTorch 2.4).
    averages = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            table = averages.table(sort_by=key, row_limit=35, max_name_column_width=90)
            break
        except (AttributeError, KeyError, ValueError):
            table = None
    print(f"PyTorch ResNet-50 step, batch {images}, {steps} steps under torch.profiler:")
    print(table if table is not None else averages.table(row_limit=35))


if __name__ == "__main__":
    main()
