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


SECTIONS = {"layers": layers, "optim": optim, "autograd": autograd}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SECTIONS:
        sys.stderr.write("usage: nn_torch.py layers|optim|autograd FILE\n")
        sys.exit(2)
    w = Writer(sys.argv[2])
    SECTIONS[sys.argv[1]](w)
    w.close()


if __name__ == "__main__":
    main()
