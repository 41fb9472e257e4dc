#!/usr/bin/python3
"""PyTorch reference for tests/nn/layers_test.cpp and tests/optim/optim_test.cpp.

Usage: nn_torch.py layers|optim FILE. Draws inputs with torch's own seeded generator, runs
PyTorch's layers, losses or optimisers on them, and writes FILE: for every array a header line
"name dtype shape" (shape as d0,d1,... or "-" for 0-dim) and a line of values (float.hex for
floating arrays, so they round-trip exactly; integers as text). The C++ tests read the inputs
from the file, run Tessera on them and compare with the outputs.

layers: Linear (2-D and 3-D inputs, with and without bias), BatchNorm1d (several training steps
then evaluation; [N, C] and [N, C, L]; momentum None; affine off; no running statistics),
mse_loss, cross_entropy (ordinary and huge logits), in float32 and float64.

optim: 5-step trajectories of SGD (plain, momentum, dampening, weight decay, nesterov, maximize)
and Adam/AdamW (defaults, weight decay, amsgrad, other betas) on two parameters, from the same
initial values and the same gradients; parameter 1 has no gradient at step 2 (skipped, and its
Adam step count does not advance). float32 and float64.
"""

import sys

try:
    import torch
except ImportError:
    sys.stderr.write("nn_torch.py: PyTorch is not importable by %s; install it with "
                     "`bash cmake/install-deps.sh --test` (Debian's python3-torch)\n" % sys.executable)
    sys.exit(2)

torch.set_num_threads(1)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class Writer:
    def __init__(self, path):
        self.out = open(path, "w")

    def put(self, name, tensor):
        t = tensor.detach().cpu()
        shape = ",".join(str(d) for d in t.shape) if t.dim() > 0 else "-"
        if t.dtype in (torch.float32, torch.float64):
            dtype = "float32" if t.dtype == torch.float32 else "float64"
            values = " ".join(float(v).hex() for v in t.reshape(-1).to(torch.float64).tolist())
        else:
            dtype = "int64"
            values = " ".join(str(int(v)) for v in t.reshape(-1).tolist())
        self.out.write("%s %s %s\n%s\n" % (name, dtype, shape, values))

    def close(self):
        self.out.close()


def layers(w):
    for dname, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(1234)

        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

        # Linear
        for bias in (True, False):
            tag = "linear%s.%s" % ("" if bias else "_nobias", dname)
            lin = torch.nn.Linear(7, 3, bias=bias, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(randn(3, 7))
                if bias:
                    lin.bias.copy_(randn(3))
            x2, x3 = randn(5, 7), randn(2, 5, 7)
            w.put(tag + ".weight", lin.weight)
            if bias:
                w.put(tag + ".bias", lin.bias)
            w.put(tag + ".x2", x2)
            w.put(tag + ".x3", x3)
            w.put(tag + ".y2", lin(x2))
            w.put(tag + ".y3", lin(x3))

        # BatchNorm1d: three training steps, then evaluation.
        variants = {
            "bn2": dict(shape=(8, 4), kwargs={}),
            "bn3": dict(shape=(5, 4, 3), kwargs={}),
            "bn_cumulative": dict(shape=(6, 4), kwargs={"momentum": None}),
            "bn_noaffine": dict(shape=(6, 4), kwargs={"affine": False, "momentum": 0.3}),
            "bn_nostats": dict(shape=(6, 4), kwargs={"track_running_stats": False}),
        }
        for vname, v in variants.items():
            tag = "%s.%s" % (vname, dname)
            bn = torch.nn.BatchNorm1d(4, dtype=dtype, **v["kwargs"])
            if bn.affine:
                with torch.no_grad():
                    bn.weight.copy_(randn(4))
                    bn.bias.copy_(randn(4))
                w.put(tag + ".weight", bn.weight)
                w.put(tag + ".bias", bn.bias)
            bn.train()
            for step in range(3):
                # Channels with different means and scales, so the statistics matter.
                x = randn(*v["shape"], scale=2.0) + torch.arange(4, dtype=dtype).view(
                    [1, 4] + [1] * (len(v["shape"]) - 2)) * 3
                y = bn(x)
                w.put("%s.train%d.x" % (tag, step), x)
                w.put("%s.train%d.y" % (tag, step), y)
                if bn.track_running_stats:
                    w.put("%s.train%d.running_mean" % (tag, step), bn.running_mean)
                    w.put("%s.train%d.running_var" % (tag, step), bn.running_var)
                    w.put("%s.train%d.num_batches_tracked" % (tag, step), bn.num_batches_tracked)
            bn.eval()
            x = randn(*v["shape"], scale=2.0)
            w.put(tag + ".eval.x", x)
            w.put(tag + ".eval.y", bn(x))

        # Losses
        a, b = randn(4, 5), randn(4, 5)
        w.put("mse.%s.a" % dname, a)
        w.put("mse.%s.b" % dname, b)
        w.put("mse.%s.loss" % dname, torch.nn.functional.mse_loss(a, b))
        for cname, scale in (("ce", 1.0), ("ce_large", 1e4)):
            logits = randn(6, 5, scale=scale)
            if scale > 1:
                logits[0, 0], logits[1, 2] = 3e4, -3e4  # exp would overflow in any dtype
            targets = torch.tensor([0, 2, 4, 1, 3, 2])
            w.put("%s.%s.logits" % (cname, dname), logits)
            w.put("%s.%s.targets" % (cname, dname), targets)
            w.put("%s.%s.loss" % (cname, dname), torch.nn.functional.cross_entropy(logits, targets))


# name -> (class, options); the C++ test has the same table.
OPTIMISERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    "sgd_dampening": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, dampening=0.3)),
    "sgd_weight_decay": (torch.optim.SGD, dict(lr=0.1, momentum=0.5, weight_decay=0.05)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True,
                                           weight_decay=0.01)),
    "sgd_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_weight_decay": (torch.optim.Adam, dict(lr=0.02, weight_decay=0.1)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.02, amsgrad=True, betas=(0.8, 0.9))),
    "adam_betas": (torch.optim.Adam, dict(lr=0.05, betas=(0.5, 0.6), eps=1e-3)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=0.02, weight_decay=0.1, amsgrad=True)),
}
STEPS = 5
SHAPES = ((3, 4), (5,))
SKIP = (1, 2)  # parameter 1 has no gradient at step 2


def optim(w):
    for dname, dtype in DTYPES.items():
        for oname, (cls, options) in OPTIMISERS.items():
            g = torch.Generator().manual_seed(99)
            tag = "%s.%s" % (oname, dname)
            params = [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype))
                      for s in SHAPES]
            for i, p in enumerate(params):
                w.put("%s.p%d.init" % (tag, i), p)
            opt = cls(params, **options)
            for step in range(STEPS):
                for i, p in enumerate(params):
                    # Gradients of mixed magnitude, some tiny, so eps and the moments matter.
                    grad = torch.randn(*SHAPES[i], generator=g, dtype=torch.float64)
                    grad = (grad * torch.exp(torch.randn(*SHAPES[i], generator=g,
                                                         dtype=torch.float64) * 2)).to(dtype)
                    if (i, step) == SKIP:
                        p.grad = None
                    else:
                        p.grad = grad
                        w.put("%s.p%d.grad%d" % (tag, i, step), grad)
                opt.step()
                for i, p in enumerate(params):
                    w.put("%s.p%d.step%d" % (tag, i, step), p)


def autograd(w):
    """An MLP with BatchNorm1d (training mode) and cross entropy, and one with mse: loss,
    every parameter's gradient and the running statistics after one forward, for the traced
    programs of tests/autograd/torch_test.cpp."""
    for dname, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(99)

        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

        fc1 = torch.nn.Linear(5, 8, dtype=dtype)
        bn = torch.nn.BatchNorm1d(8, dtype=dtype)
        fc2 = torch.nn.Linear(8, 3, dtype=dtype)
        with torch.no_grad():
            for p in (fc1.weight, fc1.bias, bn.weight, bn.bias, fc2.weight, fc2.bias):
                p.copy_(randn(*p.shape))
        params = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "bn.weight": bn.weight,
                  "bn.bias": bn.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
        for name, p in params.items():
            w.put("mlp.%s.%s" % (dname, name), p)
        x = randn(6, 5, scale=2.0)
        targets = torch.tensor([0, 2, 1, 1, 0, 2])
        w.put("mlp.%s.x" % dname, x)
        w.put("mlp.%s.targets" % dname, targets)
        bn.train()
        logits = fc2(torch.relu(bn(fc1(x))))
        loss = torch.nn.functional.cross_entropy(logits, targets)
        loss.backward()
        w.put("mlp.%s.loss" % dname, loss)
        for name, p in params.items():
            w.put("mlp.%s.grad.%s" % (dname, name), p.grad)
        w.put("mlp.%s.running_mean" % dname, bn.running_mean)
        w.put("mlp.%s.running_var" % dname, bn.running_var)
        # Evaluation mode: the running statistics normalise; mse against a target.
        bn.eval()
        for p in params.values():
            p.grad = None
        target = randn(6, 3)
        w.put("mlp.%s.target" % dname, target)
        loss = torch.nn.functional.mse_loss(fc2(torch.relu(bn(fc1(x)))), target)
        loss.backward()
        w.put("mlp.%s.eval_loss" % dname, loss)
        for name, p in params.items():
            w.put("mlp.%s.eval_grad.%s" % (dname, name), p.grad)


# Convolution cases: name, (N, C, H, W), out channels, kernel, stride, padding, dilation, groups,
# bias. A grid over the arguments: same padding, stride 2, 1x1 (the no-im2col path) with and
# without stride, dilation, grouped and depthwise, a 7x7 stem on a non-square image, a
# non-square kernel and stride, and a kernel exactly the size of the input.
CONV_CASES = [
    ("same3x3", (2, 3, 7, 7), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ("stride2", (2, 3, 8, 7), 5, (3, 3), (2, 2), (1, 1), (1, 1), 1, False),
    ("pointwise", (3, 6, 5, 4), 4, (1, 1), (1, 1), (0, 0), (1, 1), 1, True),
    ("pointwise_s2", (2, 6, 7, 6), 8, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),
    ("dilated", (2, 3, 9, 8), 4, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),
    ("grouped", (2, 4, 6, 6), 6, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("depthwise", (2, 4, 6, 5), 4, (3, 3), (2, 1), (1, 1), (1, 1), 4, False),
    ("stem7x7", (2, 3, 15, 13), 5, (7, 7), (2, 2), (3, 3), (1, 1), 1, False),
    ("rect", (2, 3, 6, 9), 4, (2, 3), (2, 1), (0, 1), (1, 2), 1, True),
    ("whole", (3, 2, 5, 5), 3, (5, 5), (1, 1), (0, 0), (1, 1), 1, True),
    # 3x3 with stride 1 (Winograd on CPU): odd outputs (cut tiles), no padding (the input
    # gradient's is 2), padding 2 (the input gradient's is 0), different paddings per side.
    ("wino_odd", (2, 5, 9, 7), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ("wino_pad0", (3, 4, 8, 6), 3, (3, 3), (1, 1), (0, 0), (1, 1), 1, False),
    ("wino_pad2", (2, 3, 5, 6), 4, (3, 3), (1, 1), (2, 2), (1, 1), 1, True),
    ("wino_rect", (2, 4, 7, 5), 5, (3, 3), (1, 1), (0, 2), (1, 1), 1, False),
    # 3x3 with stride 2 (Winograd on CPU too, as is "stride2"): an odd output height (13 x 14,
    # cut tiles), no padding, padding 2 (tiles of padding only at the edges), different paddings
    # per side with an odd output width (4 x 13). Sizes that Winograd takes with stride 2.
    ("wino_s2_odd", (2, 5, 25, 27), 6, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ("wino_s2_pad0", (3, 4, 10, 9), 3, (3, 3), (2, 2), (0, 0), (1, 1), 1, False),
    ("wino_s2_pad2", (2, 3, 6, 5), 4, (3, 3), (2, 2), (2, 2), (1, 1), 1, True),
    ("wino_s2_rect", (2, 4, 9, 25), 5, (3, 3), (2, 2), (0, 2), (1, 1), 1, False),
]


def conv(w):
    """conv2d forward and gradients (x, weight, bias) for an upstream gradient gy, per case,
    computed in float64; pooling (max, avg, adaptive) forward and input gradient; BatchNorm2d
    over three training steps (outputs, running statistics, the gradients of the last step) and
    in evaluation."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(4321)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    for name, xs, out, k, stride, pad, dil, groups, bias in CONV_CASES:
        x = randn(*xs).requires_grad_()
        wt = randn(out, xs[1] // groups, *k).requires_grad_()
        b = randn(out).requires_grad_() if bias else None
        y = F.conv2d(x, wt, b, stride=stride, padding=pad, dilation=dil, groups=groups)
        gy = randn(*y.shape)
        y.backward(gy)
        tag = "conv." + name
        w.put(tag + ".x", x)
        w.put(tag + ".w", wt)
        if bias:
            w.put(tag + ".b", b)
            w.put(tag + ".db", b.grad)
        w.put(tag + ".gy", gy)
        w.put(tag + ".y", y)
        w.put(tag + ".dx", x.grad)
        w.put(tag + ".dw", wt.grad)

    # Pooling: (name, function, shape, kwargs); ties in "max_ties" (values on a coarse grid).
    pools = [
        ("max_stem", "max", (2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
        ("max_2x2", "max", (2, 2, 8, 6), dict(kernel_size=2)),
        ("max_ceil", "max", (1, 2, 8, 8), dict(kernel_size=3, stride=2, ceil_mode=True)),
        ("max_dilated", "max", (2, 2, 7, 7), dict(kernel_size=2, stride=1, padding=1, dilation=2)),
        ("max_ties", "max", (2, 2, 6, 6), dict(kernel_size=3, stride=1, padding=1)),
        ("avg_pad", "avg", (2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
        ("avg_nopadcount", "avg", (2, 3, 9, 9),
         dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
        ("avg_ceil", "avg", (1, 2, 8, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
        ("avg_divisor", "avg", (2, 2, 6, 6), dict(kernel_size=2, divisor_override=3)),
        ("adaptive_global", "adaptive", (2, 5, 7, 6), dict(output_size=1)),
        ("adaptive_uneven", "adaptive", (2, 3, 7, 5), dict(output_size=(3, 2))),
        ("adaptive_up", "adaptive", (1, 2, 3, 4), dict(output_size=(4, 5))),
    ]
    for name, kind, shape, kwargs in pools:
        x = randn(*shape)
        if name == "max_ties":
            x = torch.round(x * 2) / 2
        x.requires_grad_()
        if kind == "max":
            y = F.max_pool2d(x, **kwargs)
        elif kind == "avg":
            y = F.avg_pool2d(x, **kwargs)
        else:
            y = F.adaptive_avg_pool2d(x, **kwargs)
        gy = randn(*y.shape)
        y.backward(gy)
        tag = "pool." + name
        w.put(tag + ".x", x)
        w.put(tag + ".gy", gy)
        w.put(tag + ".y", y)
        w.put(tag + ".dx", x.grad)

    # BatchNorm2d: three training steps (the last with gradients), then evaluation.
    bn = torch.nn.BatchNorm2d(3, momentum=0.2, dtype=torch.float64)
    with torch.no_grad():
        bn.weight.copy_(randn(3))
        bn.bias.copy_(randn(3))
    w.put("bn2d.weight", bn.weight)
    w.put("bn2d.bias", bn.bias)
    for step in range(3):
        x = (randn(4, 3, 5, 6) * 2 + 1).requires_grad_()
        y = bn(x)
        gy = randn(*y.shape)
        y.backward(gy)
        tag = "bn2d.train%d" % step
        w.put(tag + ".x", x)
        w.put(tag + ".y", y)
        w.put(tag + ".gy", gy)
        w.put(tag + ".dx", x.grad)
        w.put(tag + ".running_mean", bn.running_mean)
        w.put(tag + ".running_var", bn.running_var)
    w.put("bn2d.dweight", bn.weight.grad)  # summed over the three steps
    w.put("bn2d.dbias", bn.bias.grad)
    bn.eval()
    x = randn(2, 3, 4, 4)
    w.put("bn2d.eval.x", x)
    w.put("bn2d.eval.y", bn(x))


def resnet(w, path):
    """torchvision's ResNets: the state-dict keys and shapes of resnet18 and resnet50; one
    Bottleneck block with a downsample (stride 2) and one BasicBlock, in float64 with random
    weights and running statistics saved through safetensors (PATH.<block>.safetensors), their
    training-mode output and every gradient for an upstream gradient gy, the running
    statistics after that step, and the evaluation-mode output."""
    try:
        import torchvision
        from safetensors.torch import save_file
    except ImportError as e:
        sys.stderr.write("nn_torch.py resnet: %s (install with `bash cmake/install-deps.sh "
                         "--test`: python3-torchvision, safetensors)\n" % e)
        sys.exit(2)
    from torchvision.models.resnet import BasicBlock, Bottleneck
    for name in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, name)(num_classes=10)
        for key, value in model.state_dict().items():
            w.put("%s.key.%s" % (name, key), torch.tensor(list(value.shape), dtype=torch.int64))
    g = torch.Generator().manual_seed(777)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    blocks = {
        "bottleneck": (Bottleneck, dict(inplanes=16, planes=8, stride=2), (2, 16, 9, 8)),
        "basic": (BasicBlock, dict(inplanes=6, planes=6, stride=1), (2, 6, 7, 7)),
    }
    for tag, (cls, kwargs, shape) in blocks.items():
        downsample = None
        if cls is Bottleneck:
            out = kwargs["planes"] * 4
            downsample = torch.nn.Sequential(
                torch.nn.Conv2d(kwargs["inplanes"], out, 1, stride=kwargs["stride"], bias=False),
                torch.nn.BatchNorm2d(out))
        block = cls(downsample=downsample, **kwargs).double()
        with torch.no_grad():
            for key, value in block.state_dict().items():
                if key.endswith("num_batches_tracked"):
                    continue
                if key.endswith("running_var"):
                    value.copy_(randn(*value.shape).abs() + 0.5)
                else:
                    value.copy_(randn(*value.shape) * (0.3 if value.dim() == 4 else 1.0))
        save_file({k: v.contiguous() for k, v in block.state_dict().items()},
                  "%s.%s.safetensors" % (path, tag))
        x = randn(*shape).requires_grad_()
        block.train()
        y = block(x)
        gy = randn(*y.shape)
        y.backward(gy)
        w.put(tag + ".x", x)
        w.put(tag + ".gy", gy)
        w.put(tag + ".y", y)
        w.put(tag + ".dx", x.grad)
        for key, p in block.named_parameters():
            w.put(tag + ".grad." + key, p.grad)
        for key, b in block.named_buffers():
            w.put(tag + ".after." + key, b)
        block.eval()
        w.put(tag + ".eval_y", block(x))


def schedulers(w):
    """The learning rate after construction and after each of 30 steps of StepLR,
    CosineAnnealingLR (past T_max, where torch's recursion turns back up) and LinearLR, over SGD
    and Adam, for tests/optim/lr_scheduler_test.cpp."""
    cases = {
        "step": (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), "sgd"),
        "cosine": (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=0.001),
                   "sgd"),
        "linear": (lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25,
                                                               end_factor=1.0, total_iters=6),
                   "sgd"),
        "linear_default": (lambda o: torch.optim.lr_scheduler.LinearLR(o), "adam"),
    }
    for name, (make, kind) in cases.items():
        p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        opt = (torch.optim.SGD([p], lr=0.1) if kind == "sgd" else torch.optim.Adam([p], lr=0.01))
        sched = make(opt)
        rates = [sched.get_last_lr()[0]]
        for _ in range(30):
            p.grad = torch.ones(2, dtype=torch.float64)
            opt.step()
            sched.step()
            rates.append(sched.get_last_lr()[0])
        w.put("%s.lr" % name, torch.tensor(rates, dtype=torch.float64))


# cross_entropy's and nll_loss's option sets for class_losses, by name: the logits ("logits", or
# "masked" with a -inf logit off the targets), the targets ("targets" in [0, 5), or "ignored" with
# -100s), the class weights, ignore_index and label_smoothing. The "nd_" sets use PyTorch's
# K-dimensional form: logits [2, 5, 3, 2] ("logits_nd") or [3, 5, 4] ("logits_3d") with targets
# [2, 3, 2] or [3, 4], or [7, 5, 1] ("logits_unit": "logits" with a unit dim) with targets [7, 1],
# and v of the targets' shape. tests/nn/loss_test.cpp lists the same sets.
CE_CASES = {
    "plain": dict(),
    "ignore": dict(t="ignored"),
    "weight": dict(weight=True),
    "smooth": dict(ls=0.1),
    "weight_smooth": dict(weight=True, ls=0.3),
    "all": dict(t="ignored", weight=True, ls=0.25),
    "in_range": dict(ignore_index=2, weight=True, ls=0.3),
    "masked": dict(x="masked", t="ignored", weight=True),
    "masked_smooth": dict(x="masked", t="ignored", ls=0.2),
    "nd_plain": dict(x="logits_nd", t="targets_nd", v="v_nd"),
    "nd_all": dict(x="logits_nd", t="ignored_nd", weight=True, ls=0.25, v="v_nd"),
    "nd_3d": dict(x="logits_3d", t="ignored_3d", weight=True, v="v_3d"),
    "nd_unit": dict(x="logits_unit", t="ignored_unit", weight=True, ls=0.1, v="v_unit"),
}
NLL_CASES = {
    "plain": dict(),
    "weight_ignore": dict(t="ignored", weight=True),
    "in_range": dict(ignore_index=2),
    "nd_weight_ignore": dict(x="log_probs_nd", t="ignored_nd", weight=True, v="v_nd"),
}


def class_losses(w):
    """cross_entropy and nll_loss with each option set of CE_CASES and NLL_CASES and each
    reduction: the loss, and the gradient with respect to the logits (the log-probabilities for
    nll_loss); for reduction "none" the gradient of sum(loss * v)."""
    for dname, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(7)
        logits = torch.randn(7, 5, generator=g, dtype=torch.float64) * 2
        logits[1, 0], logits[1, 1] = 40.0, -40.0
        masked = logits.clone()
        masked[0, 3] = float("-inf")  # row 0's target is 0; row 1 is ignored in "ignored"
        masked[2, 4] = float("-inf")
        weight = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
        v = torch.randn(7, generator=g, dtype=torch.float64)
        logits_nd = torch.randn(2, 5, 3, 2, generator=g, dtype=torch.float64) * 2
        logits_3d = torch.randn(3, 5, 4, generator=g, dtype=torch.float64) * 2
        vs = {"v": v, "v_nd": torch.randn(2, 3, 2, generator=g, dtype=torch.float64),
              "v_3d": torch.randn(3, 4, generator=g, dtype=torch.float64)}
        logits, masked, weight = logits.to(dtype), masked.to(dtype), weight.to(dtype)
        logits_nd, logits_3d = logits_nd.to(dtype), logits_3d.to(dtype)
        vs = {name: t.to(dtype) for name, t in vs.items()}
        vs["v_unit"] = vs["v"].unsqueeze(1)
        inputs = {"logits": logits, "masked": masked, "logits_nd": logits_nd,
                  "logits_3d": logits_3d, "logits_unit": logits.unsqueeze(2)}
        log_probs = {"log_probs": torch.log_softmax(logits, 1),
                     "log_probs_nd": torch.log_softmax(logits_nd, 1)}
        targets_nd = torch.randint(0, 5, (2, 3, 2), generator=g)
        ignored_nd = targets_nd.clone()
        ignored_nd[0, 1, 0], ignored_nd[1, 2, 1] = -100, -100
        targets = {"targets": torch.tensor([0, 4, 2, 2, 1, 3, 2]),
                   "ignored": torch.tensor([0, -100, 2, -100, 1, 3, 4]),
                   "targets_nd": targets_nd, "ignored_nd": ignored_nd,
                   "ignored_3d": torch.tensor([[0, 4, -100, 2], [1, 1, 3, 0], [-100, 2, 4, 3]]),
                   "ignored_unit": torch.tensor([0, -100, 2, -100, 1, 3, 4]).unsqueeze(1)}
        prefix = "ce.%s." % dname
        for name, t in list(inputs.items()) + list(log_probs.items()) + list(targets.items()):
            w.put(prefix + name, t)
        w.put(prefix + "weight", weight)
        for name, t in vs.items():
            w.put(prefix + name, t)
        for loss_name, cases in (("ce", CE_CASES), ("nll", NLL_CASES)):
            for case, o in cases.items():
                for reduction in ("mean", "sum", "none"):
                    kwargs = dict(reduction=reduction, ignore_index=o.get("ignore_index", -100),
                                  weight=weight if o.get("weight") else None)
                    target = targets[o.get("t", "targets")]
                    v = vs[o.get("v", "v")]
                    if loss_name == "ce":
                        x = inputs[o.get("x", "logits")].clone().requires_grad_(True)
                        loss = torch.nn.functional.cross_entropy(
                            x, target, label_smoothing=o.get("ls", 0.0), **kwargs)
                    else:
                        x = log_probs[o.get("x", "log_probs")].detach().clone().requires_grad_(True)
                        loss = torch.nn.functional.nll_loss(x, target, **kwargs)
                    (loss * v if reduction == "none" else loss).sum().backward()
                    name = "%s%s.%s.%s" % (prefix, loss_name, case, reduction)
                    w.put(name, loss)
                    w.put(name + ".grad", x.grad)


def losses(w):
    """l1_loss, smooth_l1_loss (beta 1, 0.5 and 0) and binary_cross_entropy_with_logits (logits
    up to +-40, soft targets): the loss and its gradient with respect to the input, for
    tests/nn/loss_test.cpp; then class_losses."""
    for dname, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(5)
        a = torch.randn(6, 5, generator=g, dtype=torch.float64) * 2
        b = torch.randn(6, 5, generator=g, dtype=torch.float64) * 2
        b[0, :3] = a[0, :3] + torch.tensor([0.25, -0.4, 0.0], dtype=torch.float64)  # |d| < beta
        logits = torch.randn(6, 5, generator=g, dtype=torch.float64) * 3
        logits[1, 0], logits[1, 1] = 40.0, -40.0
        soft = torch.rand(6, 5, generator=g, dtype=torch.float64)
        a, b, logits, soft = a.to(dtype), b.to(dtype), logits.to(dtype), soft.to(dtype)
        w.put("loss.%s.a" % dname, a)
        w.put("loss.%s.b" % dname, b)
        w.put("loss.%s.logits" % dname, logits)
        w.put("loss.%s.soft" % dname, soft)
        cases = {
            "l1": (lambda x: torch.nn.functional.l1_loss(x, b), a),
            "smooth1": (lambda x: torch.nn.functional.smooth_l1_loss(x, b, beta=1.0), a),
            "smooth05": (lambda x: torch.nn.functional.smooth_l1_loss(x, b, beta=0.5), a),
            "smooth0": (lambda x: torch.nn.functional.smooth_l1_loss(x, b, beta=0.0), a),
            "bce": (lambda x: torch.nn.functional.binary_cross_entropy_with_logits(x, soft),
                    logits),
        }
        for name, (fn, x0) in cases.items():
            x = x0.clone().requires_grad_(True)
            loss = fn(x)
            loss.backward()
            w.put("loss.%s.%s" % (dname, name), loss)
            w.put("loss.%s.%s.grad" % (dname, name), x.grad)
    class_losses(w)


def grad_scaler(w):
    """torch.cuda.amp.GradScaler's own control flow (unscale, skip, update, state) over SGD with
    momentum, 12 steps with injected inf, NaN and an overflow of the scaled gradient, for
    tests/optim/grad_scaler_test.cpp. Torch 1.13's CPU build has no kernels for the scaler's two
    ops and refuses CPU tensors, so the kernels are their CPU definitions (ATen's
    AmpGradScalerKernels: unscale multiplies by the float reciprocal and flags inf/NaN; update
    multiplies the float scale by a double factor and rounds to float) and the CUDA-only asserts
    are lifted; everything else is torch's GradScaler as shipped."""
    import torch.cuda.amp.grad_scaler as gs

    def unscale(grads, found_inf, inv_scale):
        for grad in grads:
            if not bool(torch.isfinite(grad).all()):
                found_inf.fill_(1.0)
            grad.mul_(inv_scale)

    def update_scale(scale, tracker, found_inf, growth, backoff, interval):
        if found_inf.item():
            scale.fill_(scale.item() * backoff)
            tracker.fill_(0)
        else:
            successful = tracker.item() + 1
            if successful == interval:
                grown = torch.tensor(scale.item() * growth, dtype=torch.float32)
                if bool(torch.isfinite(grown)):
                    scale.copy_(grown)
                tracker.fill_(0)
            else:
                tracker.fill_(successful)
        return scale

    class Replicator(gs._MultiDeviceReplicator):
        def __init__(self, master_tensor):
            self.master = master_tensor
            self._per_device_tensors = {}

    torch._amp_foreach_non_finite_check_and_unscale_ = unscale
    torch._amp_update_scale_ = update_scale
    gs._MultiDeviceReplicator = Replicator
    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    scaler = gs.GradScaler(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                           growth_interval=3)
    torch.cuda.is_available = available
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))

    g = torch.Generator().manual_seed(17)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float32))
              for s in ((3, 4), (5,))]
    for i, p in enumerate(params):
        w.put("scaler.p%d.init" % i, p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scales, trackers, stepped = [], [], []
    for step in range(12):
        for i, p in enumerate(params):
            grad = torch.randn(*p.shape, generator=g, dtype=torch.float32) * scaler._scale
            if (i, step) == (0, 3):
                grad[0, 1] = float("inf")
            if (i, step) == (1, 4):
                grad[2] = float("nan")
            if (i, step) == (0, 8):
                grad[1, 1] = float("-inf")
            if (i, step) == (1, 10):
                grad[0] = torch.tensor(1e36) * scaler._scale  # overflows float32 when scaled
            p.grad = grad
            w.put("scaler.p%d.grad%d" % (i, step), grad)
        before = [p.detach().clone() for p in params]
        scaler.step(opt)
        stepped.append(0.0 if all(torch.equal(a, p) for a, p in zip(before, params)) else 1.0)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(float(scaler._get_growth_tracker()))
        for i, p in enumerate(params):
            w.put("scaler.p%d.step%d" % (i, step), p)
    w.put("scaler.scale", torch.tensor(scales, dtype=torch.float64))
    w.put("scaler.tracker", torch.tensor(trackers, dtype=torch.float64))
    w.put("scaler.stepped", torch.tensor(stepped, dtype=torch.float64))
    state = scaler.state_dict()
    w.put("scaler.state", torch.tensor([state["scale"], state["growth_factor"],
                                        state["backoff_factor"], state["growth_interval"],
                                        state["_growth_tracker"]], dtype=torch.float64))


def master_weights(w):
    """fp32 master weights of half parameters: torch's SGD (momentum) and Adam on float32
    masters made from the half-rounded initial values, fed the half gradients converted to
    float; the master and its half rounding after each of 5 steps."""
    for oname, make in (("sgd", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
                        ("adam", lambda ps: torch.optim.Adam(ps, lr=0.01))):
        g = torch.Generator().manual_seed(23)
        low = [torch.randn(*s, generator=g, dtype=torch.float32).half() for s in ((3, 4), (5,))]
        masters = [torch.nn.Parameter(p.float()) for p in low]
        for i, p in enumerate(low):
            w.put("master.%s.p%d.init" % (oname, i), p.float())
        opt = make(masters)
        for step in range(5):
            for i, m in enumerate(masters):
                grad = torch.randn(*m.shape, generator=g, dtype=torch.float32).half()
                w.put("master.%s.p%d.grad%d" % (oname, i, step), grad.float())
                m.grad = grad.float()
            opt.step()
            for i, m in enumerate(masters):
                w.put("master.%s.p%d.master%d" % (oname, i, step), m)
                w.put("master.%s.p%d.low%d" % (oname, i, step), m.detach().half().float())


def param_groups(w):
    """Parameter groups with their own lr / weight_decay: SGD (momentum, weight decay) and Adam
    over three parameters in two groups (group 0 with its own lr, group 1 with its own
    weight_decay), a StepLR (SGD) or CosineAnnealingLR (Adam) stepping every group's rate,
    6 steps; the parameters and every group's rate after each, for tests/optim/optim_test.cpp."""
    shapes = ((3, 4), (5,), (2, 3))
    cases = {
        "sgd": (lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=1e-3),
                lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)),
        "adam": (lambda groups: torch.optim.Adam(groups, lr=0.02, weight_decay=1e-3),
                 lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=1e-3)),
    }
    for name, (make, schedule) in cases.items():
        g = torch.Generator().manual_seed(41)
        params = [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float32))
                  for s in shapes]
        for i, p in enumerate(params):
            w.put("groups.%s.p%d.init" % (name, i), p)
        opt = make([{"params": params[:2], "lr": 0.01}, {"params": params[2:], "weight_decay": 0.1}])
        sched = schedule(opt)
        for step in range(6):
            for i, p in enumerate(params):
                p.grad = torch.randn(*p.shape, generator=g, dtype=torch.float32)
                w.put("groups.%s.p%d.grad%d" % (name, i, step), p.grad)
            opt.step()
            sched.step()
            for i, p in enumerate(params):
                w.put("groups.%s.p%d.step%d" % (name, i, step), p)
            w.put("groups.%s.lr%d" % (name, step),
                  torch.tensor([group["lr"] for group in opt.param_groups], dtype=torch.float64))


SECTIONS = {"layers": layers, "optim": optim, "autograd": autograd, "conv": conv,
            "resnet": resnet, "schedulers": schedulers, "losses": losses,
            "grad_scaler": grad_scaler, "master_weights": master_weights,
            "param_groups": param_groups}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SECTIONS:
        sys.stderr.write("usage: nn_torch.py %s FILE\n" % "|".join(SECTIONS))
        sys.exit(2)
    w = Writer(sys.argv[2])
    if sys.argv[1] == "resnet":
        resnet(w, sys.argv[2])
    else:
        SECTIONS[sys.argv[1]](w)
    w.close()


if __name__ == "__main__":
    main()
