"""The package's models as torch modules, and the map between the flat vector and their tensors.

Each twin computes the same function as its NumPy model (models/) from the same numbers: the
same layers in the same order, the same initial weights (copied over from the flat vector,
`load_flat`), the same mean softmax cross-entropy (torch.nn.functional.cross_entropy). It
takes the package's minibatch rows as they are, (B, C*H*W) of images flattened as (C, H, W),
and is written as a PyTorch user writes it (nn.Linear, nn.Conv2d, nn.BatchNorm2d, ...); the
map below moves each tensor between the two layouts:

    ours                                   torch                         map
    W{l}    (n_in, n_out)                  Linear.weight (n_out, n_in)   transpose
    C{l}    (k*k*Cin, Cout), rows (u,v,c)  Conv2d.weight (Cout,Cin,k,k)  reshape (k,k,Cin,Cout),
            (im2col's order, models/cnn.py)                              axes (3, 2, 0, 1)
    CNN W0  (h*w*c, n_out), rows NHWC      Linear.weight (n_out, c*h*w)  rows (h,w,c) -> (c,h,w):
            (our maps are NHWC)            (nn.Flatten of NCHW)          torch flattens NCHW
    BN g, b (C,)                           BatchNorm2d.weight, .bias     as they are
    BN mean, var (buffers)                 .running_mean, .running_var   as they are

So a twin's forward on the same weights gives our logits up to float32 rounding (the sums run
in another order: oneDNN's or MKL's matmul and convolution, not our im2col and BLAS), and so
do its gradients: tests/test_torch_peer.py checks the loss at step 0 and the parameter count.

torch is optional: where it is missing this module still imports (nn.Module is a stand-in) and
`twin` raises; torch_peer.torch_problem says how to install it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # the optional extra: the classes below are defined, never built
    torch = None
    nn = SimpleNamespace(Module=object)


@dataclass(frozen=True)
class Pair:
    """One tensor of a twin and where it lives in our flat vectors."""

    vector: str  # "params" (the flat parameter vector) or "buffers" (running statistics)
    name: str  # its name in model.layout or model.buffer_layout
    tensor: torch.Tensor  # a Parameter or a buffer
    to_torch: Callable[[np.ndarray], np.ndarray]  # our view -> torch's array
    from_torch: Callable[[np.ndarray], np.ndarray]  # torch's array -> our view's shape


def same(a: np.ndarray) -> np.ndarray:
    return a


def transpose(a: np.ndarray) -> np.ndarray:
    return a.T


def conv_to_torch(C: np.ndarray, k: int) -> np.ndarray:
    """Our filters (k*k*Cin, Cout), row (u*k + v)*Cin + c, as torch's (Cout, Cin, k, k)."""
    c_in = C.shape[0] // (k * k)
    return C.reshape(k, k, c_in, C.shape[1]).transpose(3, 2, 0, 1)


def conv_from_torch(w: np.ndarray) -> np.ndarray:
    """torch's filters (Cout, Cin, k, k) as ours (k*k*Cin, Cout)."""
    c_out, c_in, k, _ = w.shape
    return w.transpose(2, 3, 1, 0).reshape(k * k * c_in, c_out)


def head_to_torch(W: np.ndarray, h: int, w: int, c: int) -> np.ndarray:
    """The CNN head's first weights (h*w*c, n_out), rows of the NHWC map flattened, as a torch
    Linear after nn.Flatten of the NCHW map: (n_out, c*h*w)."""
    return W.reshape(h, w, c, W.shape[1]).transpose(3, 2, 0, 1).reshape(W.shape[1], c * h * w)


def head_from_torch(W: np.ndarray, h: int, w: int, c: int) -> np.ndarray:
    n_out = W.shape[0]
    return W.reshape(n_out, c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, n_out)


# --- the twins ------------------------------------------------------------------------------


def twin(model) -> nn.Module:
    """The torch module of our model (MLP or softmax regression, CNN, ResNet), float32, with
    torch's own initial weights: `load_flat` puts ours in."""
    if torch is None:
        raise ImportError("torch is not installed: the torch twins need it")
    kind = type(model).__name__
    if kind in ("MLP", "SoftmaxRegression"):
        return nn.Sequential(*dense_layers(model.widths))
    if kind == "CNN":
        return cnn_twin(model)
    if kind == "ResNet":
        return ResNetTwin(model.image_shape, model.n_classes, model.depth, model.channels)
    raise ValueError(f"no torch twin of {kind}")


def dense_layers(widths) -> list:
    """Linear -> ReLU ... -> Linear over widths (input first), as models/base.py's dense
    layers."""
    layers = []
    for l in range(len(widths) - 1):
        layers.append(nn.Linear(widths[l], widths[l + 1]))
        if l < len(widths) - 2:
            layers.append(nn.ReLU())
    return layers


def cnn_twin(model) -> nn.Module:
    """LeNet as models/cnn.py builds it: [conv k x k, "same" padding -> ReLU -> 2 x 2 max-pool]
    per conv layer, flatten, the dense head."""
    layers = [nn.Unflatten(1, model.image_shape)]  # rows of (C, H, W) -> NCHW images
    for l, (c_out, k) in enumerate(zip(model.channels, model.kernels, strict=True)):
        c_in = model.maps[l][2]
        layers += [nn.Conv2d(c_in, c_out, k, padding=k // 2), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Flatten(), *dense_layers(model.widths))


class Block(nn.Module):
    """out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), shortcut x itself or
    sc.bn(sc.conv(x)) (models/resnet.py)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)  # eps 1e-5, momentum 0.1: the spec's
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.sc = None
        if stride != 1 or c_in != c_out:  # a projection: option B
            conv = nn.Conv2d(c_in, c_out, 1, stride, bias=False)
            self.sc = nn.Sequential(OrderedDict(conv=conv, bn=nn.BatchNorm2d(c_out)))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.sc is None else self.sc(x)))


class ResNetTwin(nn.Module):
    """stem conv3x3 -> BN -> ReLU, three stages of (depth - 2) / 6 blocks (the first of stages
    1 and 2 at stride 2), global average pool, dense head: models/resnet.py. Its modules are
    named as our layout is ("s1.b0.conv1" is self.s1.b0.conv1), so `pairs` maps by name."""

    def __init__(self, image_shape, n_classes: int, depth: int, channels):
        super().__init__()
        C = image_shape[0]
        self.image_shape = tuple(image_shape)
        self.stem = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(C, channels[0], 3, 1, padding=1, bias=False),
                bn=nn.BatchNorm2d(channels[0]),
            )
        )
        n, width = (depth - 2) // 6, channels[0]
        for s, c_out in enumerate(channels):
            blocks = OrderedDict()
            for j in range(n):
                blocks[f"b{j}"] = Block(width, c_out, 2 if s > 0 and j == 0 else 1)
                width = c_out
            self.add_module(f"s{s}", nn.Sequential(blocks))
        self.fc = nn.Linear(width, n_classes)
        self.n_stages = len(channels)

    def forward(self, x):
        x = torch.relu(self.stem(x.reshape(x.shape[0], *self.image_shape)))
        for s in range(self.n_stages):
            x = getattr(self, f"s{s}")(x)
        return self.fc(x.mean(dim=(2, 3)))  # global average pool over H, W


# --- the map between our flat vectors and a twin's tensors ----------------------------------


def pairs(model, module) -> list[Pair]:
    """Every tensor of `module` (a `twin(model)`) with its place in our flat vectors."""
    kind = type(model).__name__
    if kind == "ResNet":
        return resnet_pairs(module)
    dense = [m for m in module if isinstance(m, nn.Linear)]
    convs = [m for m in module if isinstance(m, nn.Conv2d)]
    out = []
    for l, conv in enumerate(convs):
        to_torch = partial(conv_to_torch, k=model.kernels[l])
        out.append(Pair("params", f"C{l}", conv.weight, to_torch, conv_from_torch))
        out.append(Pair("params", f"c{l}", conv.bias, same, same))
    for l, lin in enumerate(dense):
        to_t: Callable[[np.ndarray], np.ndarray] = transpose
        from_t: Callable[[np.ndarray], np.ndarray] = transpose
        if l == 0 and convs:  # the head reads the last map: NHWC rows in ours, NCHW in torch's
            h, w, c = model.maps[-1]
            to_t = partial(head_to_torch, h=h, w=w, c=c)
            from_t = partial(head_from_torch, h=h, w=w, c=c)
        out.append(Pair("params", f"W{l}", lin.weight, to_t, from_t))
        out.append(Pair("params", f"b{l}", lin.bias, same, same))
    return out


RESNET_SUFFIXES = {  # torch's tensor name -> ours, per kind of layer
    "conv": {"weight": ""},
    "bn": {"weight": ".g", "bias": ".b", "running_mean": ".mean", "running_var": ".var"},
}


def resnet_pairs(module) -> list[Pair]:
    """The ResNet twin's tensors by name: "s1.b0.conv1.weight" is our "s1.b0.conv1",
    "s1.b0.bn1.weight" our "s1.b0.bn1.g", ".running_var" our ".var", "fc.weight" our "fc.W"
    (transposed). BatchNorm's num_batches_tracked has no twin (momentum 0.1 never reads it)."""
    out = []
    for prefix, layer in module.named_modules():
        if isinstance(layer, nn.Linear):
            out.append(Pair("params", f"{prefix}.W", layer.weight, transpose, transpose))
            out.append(Pair("params", f"{prefix}.b", layer.bias, same, same))
        elif isinstance(layer, nn.Conv2d):
            k = layer.kernel_size[0]
            to_t = lambda C, k=k: conv_to_torch(C, k)  # noqa: E731
            out.append(Pair("params", prefix, layer.weight, to_t, conv_from_torch))
        elif isinstance(layer, nn.BatchNorm2d):
            for attr, suffix in RESNET_SUFFIXES["bn"].items():
                vector = "params" if attr in ("weight", "bias") else "buffers"
                out.append(Pair(vector, prefix + suffix, getattr(layer, attr), same, same))
    return out


def load_flat(module, model, params: np.ndarray, buffers: np.ndarray | None = None) -> None:
    """Write our flat `params` (and `buffers`, the running statistics, where the model has
    them) into the twin's tensors."""
    views = {"params": model.layout.views(params)}
    if model.n_buffers:
        views["buffers"] = model.buffer_layout.views(
            model.init_buffers() if buffers is None else buffers
        )
    with torch.no_grad():
        for p in pairs(model, module):
            value = np.ascontiguousarray(p.to_torch(views[p.vector][p.name]), np.float32)
            p.tensor.copy_(torch.from_numpy(value))


def flat_of(module, model) -> tuple[np.ndarray, np.ndarray]:
    """The twin's tensors as our flat (params, buffers) float32 vectors (buffers empty for a
    model without running statistics)."""
    params = np.empty(model.n_params, np.float32)
    buffers = np.empty(model.n_buffers, np.float32)
    views = {"params": model.layout.views(params), "buffers": model.buffer_layout.views(buffers)}
    with torch.no_grad():
        for p in pairs(model, module):
            views[p.vector][p.name][...] = p.from_torch(p.tensor.detach().numpy())
    return params, buffers
