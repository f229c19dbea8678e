"""A residual network with batch norm (He et al. 2016's CIFAR family) on one flat vector.

    X (B, C*H*W) rows of (C, H, W) images, moved to NHWC once
      -> stem:   conv3x3 (C -> c0) -> BN -> ReLU
      -> stage s = 0, 1, 2 of width c_s: n basic blocks (depth = 6n + 2), the first block of
         stages 1 and 2 with stride 2 (H, W halve, rounding up)
      -> global average pool over H, W -> dense (c_2 -> n_classes) -> logits
    loss = mean_i cross_entropy(softmax(logits_i), y_i)

The basic block, and why it trains deep. A block computes a correction to its input instead of a
whole new map:

    out = relu( BN2(conv2( relu(BN1(conv1(x, stride))) )) + shortcut(x) )

so d out / d x contains the shortcut's own term: the gradient reaches early layers through the
chain of shortcuts even where the convolutions' Jacobians are small, and a block can learn to
be (nearly) the identity by driving its BN2's gamma to 0. The shortcut is x itself (identity)
when the block keeps the shape; when it halves H, W or changes the width it is a projection,
BN(conv1x1(x, stride)) ("option B" of the paper), the only extra parameters a shortcut has.
Backward, the block's output gradient dS (after the ReLU's mask) goes down BOTH branches and the
two input gradients add: dx = dx_main + (dS, or the projection's input gradient).

Batch norm, per channel c over the batch and the pixels (N = B*H*W values x_i):

    mu = mean_i x_i,  var = mean_i (x_i - mu)^2  (biased),  xhat_i = (x_i - mu) / sqrt(var + eps)
    y_i = gamma xhat_i + beta                    (eps = 1e-5; gamma, beta learned per channel)

It keeps every channel's activations at mean beta and spread gamma whatever the weights below
do, so a deep stack neither explodes nor dies at He initialisation. A conv followed by BN needs no
bias (BN subtracts any constant): the convolutions here have none. The backward must remember
that mu and var are functions of every x_i of the channel; written out (dxhat = gamma dy):

    d xhat_j / d x_i = (delta_ij - 1/N - xhat_i xhat_j / N) / sqrt(var + eps)
    =>  dx_i = gamma / sqrt(var + eps) * (dy_i - mean_j dy_j - xhat_i mean_j (dy_j xhat_j))
        dgamma = sum_i dy_i xhat_i,   dbeta = sum_i dy_i

the middle term from mu, the last from var: the gradient is projected off the directions along
which BN's output cannot move (a constant shift of the channel; a rescaling, up to eps).
ops.batchnorm_backward computes it.

Why running statistics. In training, BN normalises with the batch's own statistics; a test
prediction must not depend on which other samples share its batch (nor fail for a batch of one),
so evaluation uses fixed statistics instead: exponential averages of the batch ones,

    running_mean = 0.9 running_mean + 0.1 mu
    running_var  = 0.9 running_var  + 0.1 var * N / (N - 1)     (the unbiased variance)

updated by every training forward, as torch.nn.BatchNorm2d does (momentum 0.1; initial mean 0,
var 1). They are state, not parameters: SGD does not move them and the collective does not
average them, so they live in a second flat float32 vector beside the weights, `buffers`, with
its own `buffer_layout` (per BN, mean then var). loss_and_grad updates them in place when given
them; logits / predict / accuracy need them.

Parameters, in the flat vector in this order (resnet_plan.param_shapes): "stem.conv", its
"stem.bn.g", "stem.bn.b"; per stage s and block j: "s{s}.b{j}.conv1", ".bn1.g", ".bn1.b",
".conv2", ".bn2.g", ".bn2.b" and for a projection ".sc.conv", ".sc.bn.g", ".sc.bn.b"; then
"fc.W", "fc.b". A conv's filters are (k*k*c_in, c_out), rows in im2col's (u, v, c) order, as the
CNN's. Convolution is the CNN's im2col + matmul (models/cnn.py), at stride 1 or 2; maps are NHWC.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.models.base import FlatModel
from pipesgd_ref.models.layout import ParamLayout, on_device
from pipesgd_ref.models.resnet_plan import ConvBN, buffer_shapes, make_plan, param_shapes
from pipesgd_ref.ops import Backend

EPS = 1e-5  # batch norm's epsilon (torch's default)
MOMENTUM = 0.1  # the running statistics' weight on the new batch (torch's default)
EVAL_SLICE = 512  # evaluation runs the test set in slices of this many images


class ResNet(FlatModel):
    """stem, 3 stages of (depth - 2) / 6 basic blocks, global average pool, dense head (module
    docstring); running statistics in a buffers vector beside the parameters."""

    def __init__(
        self,
        image_shape: Sequence[int],
        n_classes: int,
        depth: int = 8,
        channels: Sequence[int] = (16, 32, 64),
        backend: Backend | str = "numpy",
    ):
        if n_classes < 2:
            raise ValueError(f"bad model shape: n_classes {n_classes} (>= 2)")
        self.plan = make_plan(image_shape, depth, channels)  # ValueError for a bad shape
        self.image_shape = tuple(int(s) for s in image_shape)
        self.n_features = int(np.prod(self.image_shape))
        self.n_classes, self.depth = n_classes, depth
        self.channels = tuple(int(c) for c in channels)
        self.units = self.plan.units()  # every conv + BN, in layout order
        self.widths = (self.plan.c_last, n_classes)  # the dense head (FlatModel's flops)
        self.layout = ParamLayout(param_shapes(self.plan, n_classes))
        self.buffer_layout = ParamLayout(buffer_shapes(self.plan))
        self._use_backend(backend)
        self._scratch: dict[tuple, dict] = {}

    # --- initial values ---------------------------------------------------------------------

    def init_params(self, seed: int, dtype=np.float32) -> np.ndarray:
        """He-normal filters and head (std sqrt(2 / fan_in)), gamma 1, beta 0, zero head bias;
        drawn in layout order from one seeded generator."""
        rng = np.random.default_rng(seed)
        params = np.zeros(self.n_params, dtype=dtype)
        v = self.layout.views(params)
        for u in self.units:
            fan_in = u.k * u.k * u.c_in
            v[u.conv][...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), v[u.conv].shape)
            v[f"{u.bn}.g"][...] = 1.0
        v["fc.W"][...] = rng.normal(0.0, np.sqrt(2.0 / self.plan.c_last), v["fc.W"].shape)
        return params

    def init_buffers(self) -> np.ndarray:
        """Running means 0, running variances 1 (torch's initial values), float32."""
        buffers = np.zeros(self.n_buffers, np.float32)
        for name, view in self.buffer_layout.views(buffers).items():
            if name.endswith(".var"):
                view[...] = 1.0
        return buffers

    # --- what ddp and the timing model ask ----------------------------------------------------

    def grad_units(self) -> list[tuple[int, int]]:
        """The gradient's ranges in the order the backward finishes them: the head, then each
        conv + BN unit from the last to the stem (within a block: the projection, conv2,
        conv1), each ending where the one before begins."""
        return [self.layout.span("fc.W", "fc.b")] + [
            self.layout.span(*u.params) for u in reversed(self.units)
        ]

    def flops_per_sample(self) -> int:
        """Multiply-adds of one image's forward pass through the convolutions and the head
        (BN, ReLU and pooling: a few operations per activation, left out as for the CNN)."""
        return sum(u.macs() for u in self.units) + super().flops_per_sample()

    # --- scratch, made once per (batch, dtype, device) ----------------------------------------

    def _buf(self, batch: int, dtype, device: bool) -> dict:
        key = (batch, np.dtype(dtype), device)
        if key in self._scratch:
            return self._scratch[key]

        def empty(*shape):
            return self._empty(shape, dtype, device)

        b: dict = {}
        for u in self.units:
            (h, w), (ho, wo) = u.size_in, u.size_out
            rows = batch * ho * wo
            first = u is self.plan.stem  # the image needs no gradient
            b[u.conv] = {
                "cols": empty(rows, u.k * u.k * u.c_in),  # im2col of the unit's input
                "Z": empty(rows, u.c_out),  # conv output, NHWC rows
                "xhat": empty(rows, u.c_out),  # BN's standardised values (for the backward)
                "Y": empty(rows, u.c_out),  # BN's output (ReLU'd in place where one follows)
                "mean": empty(u.c_out),  # the batch's statistics
                "var": empty(u.c_out),
                "dZ": empty(rows, u.c_out),
                "dcols": None if first else empty(rows, u.k * u.k * u.c_in),
                "dA": None if first else empty(batch, h, w, u.c_in),  # the input's gradient
            }
        for blk in self.plan.blocks:
            ho, wo = blk.conv2.size_out
            b[blk.name] = empty(batch * ho * wo, blk.conv2.c_out)  # dS: grad before the add
        for c in {u.c_out for u in self.units}:
            # dense_forward adds a bias: the convs have none, so they get zeros; dense_backward
            # writes the bias gradient: into a scratch that nothing reads
            zero = np.zeros(c, dtype)
            b[f"zeros{c}"] = self._to_device(zero, dtype) if device else zero
            b[f"db{c}"] = empty(c)
        (h, w), c = self.plan.size_last, self.plan.c_last
        b["P"], b["dP"] = empty(batch, c), empty(batch, c)  # the pooled features
        b["logits"], b["dlogits"] = empty(batch, self.n_classes), empty(batch, self.n_classes)
        b["dOut"] = empty(batch, h, w, c)  # the last block's output gradient
        C, H, W = self.image_shape
        b["nhwc"] = empty(batch, H, W, C) if C > 1 else None
        self._scratch[key] = b
        return b

    # --- forward ------------------------------------------------------------------------------

    def _unit_forward(self, ops, v, u: ConvBN, b: dict, A, running) -> np.ndarray:
        """conv (im2col + matmul) then BN, on the NHWC map A; returns BN's output rows.
        `running`: None (training, statistics not kept), ("update", views) (training, the
        running statistics updated), or ("use", views) (evaluation with them)."""
        s = b[u.conv]
        ops.im2col(A, u.k, u.k, u.stride, u.pad, s["cols"])  # (B*Ho*Wo, k*k*c_in)
        ops.dense_forward(s["cols"], v[u.conv], b[f"zeros{u.c_out}"], s["Z"])  # Z = cols Wc
        gamma, beta = v[f"{u.bn}.g"], v[f"{u.bn}.b"]
        if running is not None and running[0] == "use":  # evaluation: y = gamma xhat + beta
            stats = running[1]
            mean, var = stats[f"{u.bn}.mean"], stats[f"{u.bn}.var"]
            ops.batchnorm_eval(s["Z"], gamma, beta, mean, var, EPS, s["Y"])
            return s["Y"]
        ops.batchnorm_forward(s["Z"], gamma, beta, EPS, s["Y"], s["xhat"], s["mean"], s["var"])
        if running is not None:  # training with buffers: torch's momentum update
            N = s["Z"].shape[0]
            stats = running[1]
            ops.running_average(stats[f"{u.bn}.mean"], s["mean"], MOMENTUM, 1.0)
            # the unbiased variance, N / (N - 1) times the biased one (N = 1: no spread to
            # correct; torch refuses such a batch in training, this keeps the biased 0)
            ops.running_average(stats[f"{u.bn}.var"], s["var"], MOMENTUM, N / max(N - 1, 1))
        return s["Y"]

    def forward(self, params, X, running=None) -> dict:
        """Every layer's output into the scratch (returned); the logits are b["logits"].
        `running` as in _unit_forward."""
        ops, v, device = self._ops_for(params), self.layout.views(params), on_device(params)
        B = X.shape[0]
        b = self._buf(B, params.dtype, device)
        x = self._images_nhwc(X, b["nhwc"], params.dtype, device)  # (B, H, W, C)
        stem = self.plan.stem
        y = self._unit_forward(ops, v, stem, b, x, running)
        ops.relu_forward(y, y)  # in place: its backward needs only where y > 0
        x = y.reshape(B, *stem.size_out, stem.c_out)
        for blk in self.plan.blocks:
            h = self._unit_forward(ops, v, blk.conv1, b, x, running)
            ops.relu_forward(h, h)
            ho, wo = blk.conv1.size_out
            h = h.reshape(B, ho, wo, blk.conv1.c_out)
            out = self._unit_forward(ops, v, blk.conv2, b, h, running)
            if blk.shortcut is None:  # out += x: the identity
                ops.add_into(out, x.reshape(out.shape))
            else:  # out += BN(conv1x1(x, stride)): the projection
                ops.add_into(out, self._unit_forward(ops, v, blk.shortcut, b, x, running))
            ops.relu_forward(out, out)
            x = out.reshape(B, ho, wo, blk.conv2.c_out)
        ops.global_avgpool_forward(x, b["P"])  # (B, c_last)
        ops.dense_forward(b["P"], v["fc.W"], v["fc.b"], b["logits"])
        return b

    # --- backward -----------------------------------------------------------------------------

    def _unit_backward(self, ops, v, g, u: ConvBN, b: dict, dY, ready, loss):
        """BN's backward, then the conv's: the unit's gradients into g (then `ready` hears of
        them), and its input's gradient (B, H, W, c_in) returned (None for the stem)."""
        s, gamma = b[u.conv], v[f"{u.bn}.g"]
        # y = gamma xhat + beta  =>  dZ = gamma / sqrt(var + eps) (dY - mean dY - xhat mean dY xhat)
        ops.batchnorm_backward(
            dY, s["xhat"], gamma, s["var"], EPS, s["dZ"], g[f"{u.bn}.g"], g[f"{u.bn}.b"]
        )
        # Z = cols Wc  =>  dWc = cols^T dZ (the bias gradient goes to a scratch: no bias)
        ops.dense_backward(s["cols"], v[u.conv], s["dZ"], g[u.conv], b[f"db{u.c_out}"], None)
        if ready is not None:  # the unit's filters, gamma and beta are final (ddp)
            ready(*self.layout.span(*u.params), loss)
        if s["dA"] is None:
            return None
        ops.dense_input_grad(v[u.conv], s["dZ"], s["dcols"])  # dcols = dZ Wc^T
        ops.col2im(s["dcols"], u.k, u.k, u.stride, u.pad, s["dA"])  # dA = col2im(dcols)
        return s["dA"]

    def loss_and_grad(self, params, X, y, grads, ready=None, buffers=None) -> float:
        """Mean cross-entropy on (X, y) in training mode (the batch's statistics); writes
        d loss / d params into the flat `grads`. `buffers`, when given (this model's
        init_buffers() layout, on the same side as params), get the batch statistics folded
        into their running averages, in place. `ready(lo, hi, loss)` hears of each range of
        `grad_units()` as soon as it is written."""
        ops, v, g = self._ops_for(params), self.layout.views(params), self.layout.views(grads)
        running = None if buffers is None else ("update", self._buffer_views(params, buffers))
        b = self.forward(params, X, running)
        loss = ops.softmax_xent_grad(b["logits"], y, b["dlogits"])
        # logits = P W + b  =>  dW = P^T dlogits, db = sum_rows dlogits, dP = dlogits W^T
        ops.dense_backward(b["P"], v["fc.W"], b["dlogits"], g["fc.W"], g["fc.b"], None)
        if ready is not None:
            ready(*self.layout.span("fc.W", "fc.b"), loss)
        ops.dense_input_grad(v["fc.W"], b["dlogits"], b["dP"])
        ops.global_avgpool_backward(b["dP"], b["dOut"])  # every pixel: dP / (H W)
        d_out = b["dOut"]  # the gradient of the current block's output map
        for blk in reversed(self.plan.blocks):
            out = b[blk.conv2.conv]["Y"]  # the block's output, after its ReLU
            dS = b[blk.name]
            ops.relu_backward(out, d_out.reshape(out.shape), dS)  # through the final ReLU
            d_short = dS  # identity: the shortcut passes dS on unchanged
            if blk.shortcut is not None:  # the projection first: its range is the block's last
                d_short = self._unit_backward(ops, v, g, blk.shortcut, b, dS, ready, loss)
            dH = self._unit_backward(ops, v, g, blk.conv2, b, dS, ready, loss)
            h = b[blk.conv1.conv]["Y"]  # relu(BN1(conv1(x)))
            dH = dH.reshape(h.shape)
            ops.relu_backward(h, dH, dH)  # in place: dH * [h > 0]
            d_in = self._unit_backward(ops, v, g, blk.conv1, b, dH, ready, loss)
            ops.add_into(d_in, d_short.reshape(d_in.shape))  # dx = dx_main + dx_shortcut
            d_out = d_in
        stem = self.plan.stem
        y_stem = b[stem.conv]["Y"]
        d_stem = d_out.reshape(y_stem.shape)
        ops.relu_backward(y_stem, d_stem, d_stem)
        self._unit_backward(ops, v, g, stem, b, d_stem, ready, loss)
        return loss

    def _buffer_views(self, params, buffers) -> dict:
        if on_device(buffers) != on_device(params):
            where = "on the device" if on_device(params) else "on the host"
            raise TypeError(
                f"{self!r}: the weights are {where} but the buffers are not; keep the running "
                "statistics where the weights are (the backend's to_device / to_host)"
            )
        return self.buffer_layout.views(buffers)

    # --- evaluation (off the hot path) ----------------------------------------------------------

    def logits(self, params, X: np.ndarray, buffers=None) -> np.ndarray:
        """(B, n_classes) logits in evaluation mode: BN with the running statistics `buffers`
        (required), on the host (device weights and buffers are copied over first)."""
        if buffers is None:
            raise ValueError(
                "the ResNet evaluates with its batch-norm running statistics: pass buffers "
                "(model.init_buffers(), updated by loss_and_grad(..., buffers=...))"
            )
        if on_device(params):
            params = params.copy_to_host()
        if on_device(buffers):
            buffers = buffers.copy_to_host()
        stats = ("use", self.buffer_layout.views(np.asarray(buffers)))
        out = []
        for start in range(0, len(X), EVAL_SLICE):  # slices: im2col's copies are big
            b = self.forward(params, X[start : start + EVAL_SLICE], stats)
            out.append(b["logits"].copy())
        return np.concatenate(out) if out else np.empty((0, self.n_classes), params.dtype)

    def __repr__(self) -> str:
        widths = ",".join(map(str, self.channels))
        return (
            f"ResNet(depth {self.depth}, {self.image_shape} -> stages {widths} -> "
            f"{self.n_classes}, {self.n_params} params, {self.n_buffers} buffers)"
        )
