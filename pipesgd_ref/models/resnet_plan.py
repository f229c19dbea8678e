"""The residual network's plan: which convolutions, of what shape, in what order.

resnet.py runs it. A plan is plain data computed once from (image shape, depth, channels): the
stem, the blocks of each stage with their strides and shortcut kinds, every map's size, and
from these the flat layouts of the parameters and of the running statistics, and the counts
(parameters, multiply-adds). Nothing here touches an array: it is tested on its own.

    depth = 6n + 2:  1 (stem conv) + 3 stages x n blocks x 2 convs + 1 (dense head)
    stage s:         width channels[s]; the first block of stages 1 and 2 has stride 2
    map sizes:       a 3 x 3 conv with pad 1 and stride 2, and a 1 x 1 one with pad 0, both
                     give ceil(H / 2) = (H - 1) // 2 + 1: the two branches of a block agree
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipesgd_ref.ops.numpy_ops import conv_out

STAGES = 3  # the CIFAR family's three widths (He et al. 2016, section 4.2)


@dataclass(frozen=True)
class ConvBN:
    """One k x k convolution (stride, "same" padding k // 2, no bias) and the batch norm after
    it: the unit the backward hands on to ddp in one piece (its filters and its BN's gamma,
    beta are neighbours in the layout)."""

    conv: str  # the filters' name in the layout, (k*k*c_in, c_out): "s1.b0.conv1"
    bn: str  # the batch norm's prefix: params bn.g, bn.b; buffers bn.mean, bn.var
    k: int
    stride: int
    c_in: int
    c_out: int
    size_in: tuple[int, int]  # (H, W) of the map it reads

    @property
    def pad(self) -> int:
        return self.k // 2

    @property
    def size_out(self) -> tuple[int, int]:
        h, w = self.size_in
        k, stride, pad = self.k, self.stride, self.pad
        return conv_out(h, k, stride, pad), conv_out(w, k, stride, pad)

    @property
    def params(self) -> tuple[str, str, str]:
        """Its names in the parameter layout, in layout order."""
        return self.conv, f"{self.bn}.g", f"{self.bn}.b"

    def macs(self) -> int:
        """Multiply-adds per image: every output pixel, a k*k*c_in dot product per channel."""
        ho, wo = self.size_out
        return ho * wo * self.k * self.k * self.c_in * self.c_out


@dataclass(frozen=True)
class Block:
    """out = relu(BN2(conv2(relu(BN1(conv1(x))))) + shortcut(x)); shortcut None: identity."""

    name: str  # "s{stage}.b{index}"
    conv1: ConvBN
    conv2: ConvBN
    shortcut: ConvBN | None

    def units(self) -> list[ConvBN]:
        """Its units in layout order: conv1, conv2, then the projection if any."""
        return [self.conv1, self.conv2] + ([self.shortcut] if self.shortcut else [])


@dataclass(frozen=True)
class Plan:
    stem: ConvBN
    blocks: tuple[Block, ...]
    c_last: int  # the width the pooled features have: channels[-1]
    size_last: tuple[int, int]  # the last map's (H, W), which the pooling averages over

    def units(self) -> list[ConvBN]:
        """Every conv + BN unit in layout order (the backward finishes them in reverse)."""
        return [self.stem] + [u for b in self.blocks for u in b.units()]


def blocks_per_stage(depth: int) -> int:
    """n of depth = 6n + 2; a ValueError naming the valid depths otherwise."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(
            f"depth {depth}: a ResNet of this family has 6n + 2 layers with weights "
            f"(8, 14, 20, 32, 44, 56, 110, ...); use --depth 8 or another of those"
        )
    return (depth - 2) // 6


def make_plan(image_shape: Sequence[int], depth: int, channels: Sequence[int]) -> Plan:
    """The network for (C, H, W) images: the stem, STAGES stages of n blocks, sizes included."""
    C, H, W = (int(s) for s in image_shape)
    channels = tuple(int(c) for c in channels)
    if len(channels) != STAGES or min(channels) < 1:
        raise ValueError(
            f"channels {channels}: a ResNet takes {STAGES} widths >= 1, one per stage "
            f"(--channels 16,32,64)"
        )
    if min(C, H, W) < 1:
        raise ValueError(f"image {tuple(image_shape)}: every size must be >= 1")
    n = blocks_per_stage(depth)
    stem = ConvBN("stem.conv", "stem.bn", 3, 1, C, channels[0], (H, W))
    blocks, width, size = [], channels[0], stem.size_out
    for s, c_out in enumerate(channels):
        for j in range(n):
            stride = 2 if s > 0 and j == 0 else 1  # the first block of stages 1, 2 halves H, W
            name = f"s{s}.b{j}"
            conv1 = ConvBN(f"{name}.conv1", f"{name}.bn1", 3, stride, width, c_out, size)
            conv2 = ConvBN(f"{name}.conv2", f"{name}.bn2", 3, 1, c_out, c_out, conv1.size_out)
            shortcut = None  # identity when nothing changes shape ...
            if stride != 1 or width != c_out:  # ... else a 1 x 1 projection (option B)
                shortcut = ConvBN(f"{name}.sc.conv", f"{name}.sc.bn", 1, stride, width, c_out, size)
            blocks.append(Block(name, conv1, conv2, shortcut))
            width, size = c_out, conv1.size_out
    return Plan(stem, tuple(blocks), width, size)


def param_shapes(plan: Plan, n_classes: int) -> list[tuple[str, tuple[int, ...]]]:
    """The flat parameter layout: per unit its filters (k*k*c_in, c_out) (im2col's rows: (u, v,
    c) row-major, so a torch weight (c_out, c_in, k, k) maps by transpose(2, 3, 1, 0).reshape),
    its BN's gamma and beta (c_out,); then the dense head fc.W (c_last, n_classes), fc.b."""
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for u in plan.units():
        conv, g, b = u.params
        shapes += [(conv, (u.k * u.k * u.c_in, u.c_out)), (g, (u.c_out,)), (b, (u.c_out,))]
    return shapes + [("fc.W", (plan.c_last, n_classes)), ("fc.b", (n_classes,))]


def buffer_shapes(plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
    """The running statistics' layout: per BN, in the units' order, mean then var (c_out,)."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for u in plan.units():
        out += [(f"{u.bn}.mean", (u.c_out,)), (f"{u.bn}.var", (u.c_out,))]
    return out
