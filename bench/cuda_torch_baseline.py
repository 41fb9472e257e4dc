#!/usr/bin/env python3
"""PyTorch 2's rows for bench/cuda_bench.cu, measured on the same GPU just before it.

    python3 bench/cuda_torch_baseline.py out.json
    TESSERA_TORCH_BASELINE=out.json build/.../bench/cuda_bench
    python3 bench/cuda_torch_baseline.py --amp amp.json      # mixed precision rows instead
    TESSERA_TORCH_BASELINE=out.json:amp.json build/.../bench/cuda_amp_bench

The same work as cuda_bench's rows, in float32 with TF32 off (Tessera's float products are plain
fp32; PyTorch's cuDNN convolutions would use TF32 by default): MLP training steps (mse loss, SGD
with momentum), ResNet-50's convolution layers forward and backward at batch 8 (the gradient of
sum(conv(x) * g) for x and the weight), BatchNorm2d + ReLU forward and backward, a 4096 matmul,
ResNet-50 training steps at batch 8 and 32 with their peak memory, and a device-to-device copy.
Each row is the median of timed runs after warm-up, in milliseconds; step rows end in
loss.item() as Tessera's do.

PyTorch's strongest form of the ResNet-50 step is also measured (resnet50_step_b8_graph and
_b32_graph): the whole step (forward, cross-entropy, backward, SGD with momentum) captured once
in a CUDA graph with torch.cuda.graph, as PyTorch's CUDA Graphs notes capture a whole network
(warm-up on a side stream, static input buffers, gradients left to the graph's private pool),
then per step the batch copied into the static input, the graph replayed and loss.item().
cudnn.benchmark stays off in every row, as in Tessera's rows, except the ResNet-50 rows named
_benchmark (against Tessera's with backends::cudnn::benchmark).

With --amp, the rows of bench/cuda_amp_bench.cu (issue 42) instead: PyTorch's mixed precision as
its users train, torch.autocast in fp16 (with torch.amp.GradScaler) and bf16, the model and
input in channels_last, cudnn.benchmark on: ResNet-50 steps at batch 32 and 128 with their peak
memory, the bf16 steps captured in a CUDA graph, the float32 step with TF32 on (PyTorch's
fastest float32) at batch 32 and 128; the MLP step of cuda_bench under autocast; and matmul of
8192 x 8192 half and bfloat16 matrices.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0")
amp = "--amp" in sys.argv[1:]
output = [a for a in sys.argv[1:] if a != "--amp"][0]


def sgd_step(model, loss_of):
    """One training step of Tessera's rows: SGD with momentum, zero_grad, loss, backward, step;
    returns the loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def mlp(widths):
    """cuda_bench's MLP: Linear layers of the given widths with ReLU between, on the GPU."""
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    return torch.nn.Sequential(*layers).to(dev)


def median_ms(fn, warmup=3, runs=20, events=False):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        if events:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graphed_resnet_step(images, warmup=3):
    """A ResNet-50 training step captured whole in one CUDA graph; returns step(), which copies
    a batch into the graph's static input, replays it and returns the loss (item())."""
    model = torchvision.models.resnet50(num_classes=1000).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(images, 3, 224, 224, device=dev) * 2 - 1
    labels = torch.arange(images, device=dev) % 1000
    static_x = torch.empty_like(x)
    static_x.copy_(x)
    # Warm-up on a side stream (cuDNN's and cuBLAS's first-use work, SGD's momentum buffers),
    # which capture requires; then the capture itself, with gradients set to None so that
    # backward allocates them from the graph's pool.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_x), labels).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(static_x), labels)
        static_loss.backward()
        opt.step()

    def step():
        static_x.copy_(x)  # the next batch into the captured input
        graph.replay()
        return static_loss.item()

    return step


rows = {}


def record(row, value):
    """Keeps a row and rewrites the JSON at once (whole: written aside, then renamed), so that a
    run stopped by device_check.sh's time limit still leaves the rows measured so far."""
    rows[row] = value
    with open(output + ".part", "w") as out:
        json.dump(rows, out, indent=1)
    os.replace(output + ".part", output)


def float32_rows():
    """cuda_bench's rows, float32 with TF32 off."""
    # MLP steps (cuda_bench's mlp_configs).
    for name, widths, batch in [("mlp784_b256", [784, 1024, 1024, 10], 256),
                                ("mlp4096_b2048", [4096, 4096, 4096, 4096, 1024], 2048)]:
        model = mlp(widths)
        x = torch.rand(batch, widths[0], device=dev) * 2 - 1
        y = torch.rand(batch, widths[-1], device=dev) * 2 - 1
        mlp_step = sgd_step(model, lambda: F.mse_loss(model(x), y))
        record(f"mlp_step/{name}", median_ms(mlp_step, runs=50))

    # Convolution layers, forward and backward (cuda_bench's layers).
    for name, c, o, k, stride, padding, hw in [("3x3_64_56", 64, 64, 3, 1, 1, 56),
                                               ("3x3_256_14", 256, 256, 3, 1, 1, 14),
                                               ("1x1_256to64_56", 256, 64, 1, 1, 0, 56),
                                               ("3x3s2_128_56", 128, 128, 3, 2, 1, 56),
                                               ("7x7s2_stem_224", 3, 64, 7, 2, 3, 224)]:
        x = (torch.rand(8, c, hw, hw, device=dev) * 2 - 1).requires_grad_()
        w = (torch.rand(o, c, k, k, device=dev) * 0.1).requires_grad_()
        out = (hw + 2 * padding - k) // stride + 1
        g = torch.rand(8, o, out, out, device=dev) * 2 - 1

        def conv_step():
            x.grad = None
            w.grad = None
            loss = (F.conv2d(x, w, stride=stride, padding=padding) * g).sum()
            loss.backward()
            return loss.item()

        record(f"conv/{name}", median_ms(conv_step, runs=50))

    # BatchNorm2d (training) and ReLU, forward and backward (cuda_bench's bn_shapes).
    for name, c, hw in [("64_112", 64, 112), ("256_56", 256, 56), ("256_14", 256, 14),
                        ("1024_14", 1024, 14), ("2048_7", 2048, 7)]:
        bn = torch.nn.BatchNorm2d(c).to(dev)
        x = (torch.rand(8, c, hw, hw, device=dev) * 2 - 1).requires_grad_()
        g = torch.rand(8, c, hw, hw, device=dev) * 2 - 1

        def bn_step():
            x.grad = None
            bn.zero_grad()
            loss = (torch.relu(bn(x)) * g).sum()
            loss.backward()
            return loss.item()

        record(f"bn_relu/{name}", median_ms(bn_step, runs=50))

    # matmul 4096 float, CUDA events.
    a = torch.rand(4096, 4096, device=dev)
    b = torch.rand(4096, 4096, device=dev)
    record("matmul_4096", median_ms(lambda: torch.mm(a, b), events=True))

    # Device-to-device copy of 2^26 floats (cuda_bench's reference), CUDA events.
    src = torch.rand(1 << 26, device=dev)
    dst = torch.empty_like(src)
    record("copy_2^26", median_ms(lambda: dst.copy_(src), events=True))
    del a, b, src, dst

    # ResNet-50 steps at batch 8 and 32, 224 x 224, and their peak memory over what was allocated
    # before the model was made (as cuda_bench measures its own).
    for images in (8, 32):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        model = torchvision.models.resnet50(num_classes=1000).to(dev)
        x = torch.rand(images, 3, 224, 224, device=dev) * 2 - 1
        labels = torch.arange(images, device=dev) % 1000
        resnet_step = sgd_step(model, lambda: F.cross_entropy(model(x), labels))
        record(f"resnet50_step_b{images}", median_ms(resnet_step, runs=20))
        record(f"resnet50_step_b{images}_peak_MiB",
               (torch.cuda.max_memory_allocated(dev) - base) / 2**20)
        del model, x, labels, resnet_step  # the step holds the optimiser

    # The eager steps again with cudnn.benchmark on (each convolution's algorithm timed once), against
    # Tessera's rows with backends::cudnn::benchmark.
    torch.backends.cudnn.benchmark = True
    for images in (8, 32):
        model = torchvision.models.resnet50(num_classes=1000).to(dev)
        x = torch.rand(images, 3, 224, 224, device=dev) * 2 - 1
        labels = torch.arange(images, device=dev) % 1000
        resnet_step = sgd_step(model, lambda: F.cross_entropy(model(x), labels))
        record(f"resnet50_step_b{images}_benchmark", median_ms(resnet_step, runs=20))
        del model, x, labels, resnet_step
    torch.backends.cudnn.benchmark = False

    # The same steps captured in a CUDA graph and replayed (after the eager rows, so that their peak
    # memory does not count the graphs' pools).
    for images in (8, 32):
        graphed_step = graphed_resnet_step(images)
        record(f"resnet50_step_b{images}_graph", median_ms(graphed_step, runs=20))
        del graphed_step  # the graph, its pool and the model it captured


def amp_rows():
    """cuda_amp_bench's rows: autocast fp16 and bf16, channels_last, cudnn.benchmark."""
    torch.backends.cudnn.benchmark = True

    def amp_resnet_step(images, dtype, graph=False, warmup=3):
        """A ResNet-50 step as PyTorch's AMP recipe trains it; returns step(). With graph, the
        whole step (bf16: no scaler) captured once in a CUDA graph and replayed."""
        model = torchvision.models.resnet50(num_classes=1000).to(dev)
        model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
        x = (torch.rand(images, 3, 224, 224, device=dev) * 2 - 1).to(
            memory_format=torch.channels_last)
        labels = torch.arange(images, device=dev) % 1000

        def loss_of(inp):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                return F.cross_entropy(model(inp), labels)

        if not graph:
            def step():
                opt.zero_grad(set_to_none=True)
                loss = loss_of(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                return loss.item()
            return step
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                opt.zero_grad(set_to_none=True)
                loss_of(static_x).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(captured):
            static_loss = loss_of(static_x)
            static_loss.backward()
            opt.step()

        def replay():
            static_x.copy_(x)
            captured.replay()
            return static_loss.item()
        return replay

    # matmul 8192 in half and bfloat16, CUDA events.
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a = (torch.rand(8192, 8192, device=dev) * 2 - 1).to(dtype)
        b = (torch.rand(8192, 8192, device=dev) * 2 - 1).to(dtype)
        record(f"matmul_8192_{name}", median_ms(lambda: torch.mm(a, b), events=True))
        del a, b

    # The 4096 MLP step of cuda_bench under autocast (fp16 with a GradScaler).
    widths, batch = [4096, 4096, 4096, 4096, 1024], 2048
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        model = mlp(widths)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
        x = torch.rand(batch, widths[0], device=dev) * 2 - 1
        y = torch.rand(batch, widths[-1], device=dev) * 2 - 1

        def mlp_step():
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype):
                loss = F.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.item()

        record(f"mlp_step_amp_{name}/mlp4096_b2048", median_ms(mlp_step, runs=50))
        del model, opt, mlp_step

    # ResNet-50 steps, eager, with their peak memory over what was allocated before the model.
    for images in (32, 128):
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16),
                            ("tf32", torch.float32)):
            torch.backends.cuda.matmul.allow_tf32 = dtype == torch.float32
            torch.backends.cudnn.allow_tf32 = dtype == torch.float32
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            step = amp_resnet_step(images, dtype)
            row = f"resnet50_step_{'amp_' if name != 'tf32' else ''}{name}_b{images}"
            record(row, median_ms(step, runs=20))
            record(row + "_peak_MiB", (torch.cuda.max_memory_allocated(dev) - base) / 2**20)
            del step
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    # The bf16 steps captured whole in a CUDA graph (after the eager rows: the graphs' pools).
    for images in (32, 128):
        step = amp_resnet_step(images, torch.bfloat16, graph=True)
        record(f"resnet50_step_amp_bf16_b{images}_graph", median_ms(step, runs=20))
        del step
    torch.backends.cudnn.benchmark = False


if amp:
    amp_rows()
else:
    float32_rows()

for key, value in rows.items():
    print(f"torch {key}: {value:.3f}")
