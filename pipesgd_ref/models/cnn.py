"""A LeNet-style convolutional network over one flat parameter vector.

    X (B, C*H*W) rows of (C, H, W) images
      -> [conv k x k, stride 1, "same" padding k // 2 -> ReLU -> max-pool 2 x 2, stride 2]
         x len(channels)
      -> flatten -> [dense -> ReLU] x len(hidden) -> dense -> logits (B, n_classes)
    loss = mean_i cross_entropy(softmax(logits_i), y_i)

LeNet-5's shape with channels (6, 16), kernels (5, 5), hidden (120, 84); every size is the
config's (`--channels`, `--kernels`, `--hidden`).

Convolution as im2col + matmul. A k x k convolution of an (H, W, Cin) map into Cout channels is,
at every output pixel, a dot product of the k*k*Cin inputs under the window with each of Cout
filters. im2col copies each window into one row of a matrix cols (B*Ho*Wo, k*k*Cin), and then the
whole layer is one matrix product, the same `dense_forward` the MLP uses:

    cols = im2col(A)                     (B*Ho*Wo, k*k*Cin)    every window, one row
    Z    = cols @ Wc + bc                (B*Ho*Wo, Cout)       = the NHWC map (B, Ho, Wo, Cout)

and backward, with dZ = dL/dZ in the same layout:

    dWc   = cols^T dZ,  dbc = sum_rows dZ,  dcols = dZ Wc^T    (`dense_backward`)
    dA    = col2im(dcols)                                       (B, H, W, Cin)

col2im is im2col's adjoint: each entry of dcols goes back to the pixel it was copied from, and
where windows overlap (stride < k) the contributions add. The price of the matmul is memory:
cols holds k*k copies of every pixel (25 for LeNet's 5 x 5), in exchange for the fastest kernel
there is (a tiled matmul on the GPU, BLAS on the CPU).

Layout: feature maps are NHWC (batch, height, width, channels) inside the network, so that a
window's channels are contiguous and the matmul's output needs no transpose; images arrive as
rows of (C, H, W) and are moved to NHWC once (a reshape when C = 1, as for digits and MNIST).

Max-pooling keeps, for every 2 x 2 window, the largest value and where it was (argmax, u*k + v);
its backward sends each gradient to that one position (`maxpool_backward`).

Parameters, in the flat vector in this order: per conv layer l, C{l} (k*k*Cin, Cout) and c{l}
(Cout,); then per dense layer l, W{l} (n_in, n_out) and b{l} (n_out,). He-normal weights
(variance 2 / fan_in, fan_in = k*k*Cin for a filter), zero biases.

Compute against parameters: a conv layer does Ho*Wo*k*k*Cin*Cout multiply-adds per image with
only k*k*Cin*Cout weights, so the CNN computes far more per parameter than the MLP: the ratio
that decides whether Pipe-SGD's overlap pays (tutorial 11).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.models.base import FlatModel
from pipesgd_ref.models.layout import ParamLayout, on_device
from pipesgd_ref.ops import Backend
from pipesgd_ref.ops.numpy_ops import conv_out

POOL = 2  # max-pool window and stride


class CNN(FlatModel):
    """conv -> ReLU -> max-pool, len(channels) times, then an MLP head (module docstring)."""

    def __init__(
        self,
        image_shape: Sequence[int],
        n_classes: int,
        channels: Sequence[int] = (6, 16),
        kernels: Sequence[int] = (5, 5),
        hidden: Sequence[int] = (120, 84),
        backend: Backend | str = "numpy",
    ):
        C, H, W = (int(s) for s in image_shape)
        channels, kernels = tuple(int(c) for c in channels), tuple(int(k) for k in kernels)
        if min(C, H, W) < 1 or n_classes < 2 or any(h < 1 for h in hidden):
            raise ValueError(
                f"bad model shape: image {tuple(image_shape)}, n_classes "
                f"{n_classes}, hidden {tuple(hidden)}"
            )
        if not channels or len(kernels) != len(channels) or min(channels + kernels) < 1:
            raise ValueError(
                f"a CNN needs one kernel size per conv layer, each >= 1: channels {channels}, "
                f"kernels {kernels}"
            )
        if any(k % 2 == 0 for k in kernels):
            raise ValueError(
                f"kernels {kernels}: 'same' padding (k // 2 each side) keeps the "
                f"map's size only for odd kernel sizes; use 1, 3, 5, ..."
            )
        self.image_shape = (C, H, W)
        self.n_features = C * H * W
        self.n_classes = n_classes
        self.channels, self.kernels = channels, kernels
        self.hidden = tuple(int(h) for h in hidden)
        self._use_backend(backend)
        # maps[l] = (H, W, C) entering conv layer l; the last one enters the dense head
        self.maps = [(H, W, C)]
        for c_out in channels:
            h, w, _ = self.maps[-1]
            if h < POOL or w < POOL:
                raise ValueError(
                    f"image {tuple(image_shape)}: after {len(self.maps) - 1} conv layers the "
                    f"map is {h} x {w}, too small to pool {POOL} x {POOL}; use fewer --channels"
                )
            self.maps.append((conv_out(h, POOL, POOL, 0), conv_out(w, POOL, POOL, 0), c_out))
        h, w, c = self.maps[-1]
        self.widths = (h * w * c, *self.hidden, n_classes)  # the dense head, as the MLP's
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for l, (c_out, k) in enumerate(zip(channels, kernels, strict=True)):
            shapes.append((f"C{l}", (k * k * self.maps[l][2], c_out)))
            shapes.append((f"c{l}", (c_out,)))
        for l in range(len(self.widths) - 1):
            shapes.append((f"W{l}", (self.widths[l], self.widths[l + 1])))
            shapes.append((f"b{l}", (self.widths[l + 1],)))
        self.layout = ParamLayout(shapes)
        self._buffers: dict[tuple, dict] = {}

    @property
    def n_conv(self) -> int:
        return len(self.channels)

    @property
    def n_dense(self) -> int:
        return len(self.widths) - 1

    def init_params(self, seed: int, dtype=np.float32) -> np.ndarray:
        """He-normal weights (variance 2 / fan_in), zero biases."""
        rng = np.random.default_rng(seed)
        params = np.zeros(self.n_params, dtype=dtype)
        v = self.layout.views(params)
        for l in range(self.n_conv):
            fan_in = v[f"C{l}"].shape[0]
            v[f"C{l}"][...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), v[f"C{l}"].shape)
        for l in range(self.n_dense):
            fan_in = self.widths[l]
            v[f"W{l}"][...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), v[f"W{l}"].shape)
        return params

    def grad_units(self) -> list[tuple[int, int]]:
        """As FlatModel's: the dense head's layers last first, then the conv layers' filters
        and biases (C{l}, c{l}), last first."""
        convs = [self.layout.span(f"C{l}", f"c{l}") for l in range(self.n_conv - 1, -1, -1)]
        return super().grad_units() + convs

    def flops_per_sample(self) -> int:
        """Multiply-adds of one image's forward pass (backward: about twice as many)."""
        total = 0
        for l, (c_out, k) in enumerate(zip(self.channels, self.kernels, strict=True)):
            h, w, c_in = self.maps[l]
            total += h * w * k * k * c_in * c_out  # "same" padding, stride 1: Ho, Wo = H, W
        return total + super().flops_per_sample()  # the dense head

    # --- buffers, made once per (batch, dtype, device) -----------------------------------------

    def _buf(self, batch: int, dtype, device: bool) -> dict:
        key = (batch, np.dtype(dtype), device)
        if key in self._buffers:
            return self._buffers[key]

        def empty(*shape, dt=dtype):
            return self._empty(shape, dt, device)

        names = ("cols", "Z", "R", "P", "arg", "dcols", "dZ", "dR", "dA")
        b: dict = {name: [] for name in names}
        for l, (c_out, k) in enumerate(zip(self.channels, self.kernels, strict=True)):
            h, w, c_in = self.maps[l]
            ph, pw, _ = self.maps[l + 1]
            b["cols"].append(empty(batch * h * w, k * k * c_in))  # im2col of the input
            b["Z"].append(empty(batch * h * w, c_out))  # conv output, NHWC rows
            b["R"].append(empty(batch, h, w, c_out))  # after ReLU
            b["P"].append(empty(batch, ph, pw, c_out))  # after pooling
            b["arg"].append(empty(batch, ph, pw, c_out, dt=np.int32))
            b["dcols"].append(empty(batch * h * w, k * k * c_in) if l > 0 else None)
            b["dZ"].append(empty(batch * h * w, c_out))
            b["dR"].append(empty(batch, h, w, c_out))
            b["dA"].append(empty(batch, h, w, c_in) if l > 0 else None)  # no input gradient
        b["Zd"] = [empty(batch, n) for n in self.widths[1:]]  # dense pre-activations
        # the head's input is the last pooled map, NHWC flattened: a view, no copy
        b["Ad"] = [b["P"][-1].reshape(batch, self.widths[0])]
        b["Ad"] += [empty(batch, n) for n in self.widths[1:-1]]
        b["dZd"] = [empty(batch, n) for n in self.widths[1:]]
        b["dAd"] = [empty(batch, self.widths[0])] + [empty(batch, n) for n in self.widths[1:-1]]
        if self.image_shape[0] > 1:
            H, W = self.image_shape[1:]
            b["nhwc"] = empty(batch, H, W, self.image_shape[0])
        self._buffers[key] = b
        return b

    # --- forward and backward --------------------------------------------------------------

    def forward(self, params, X) -> dict:
        """Every layer's output into the buffers (returned); the logits are b["Zd"][-1]."""
        ops, v, device = self._ops_for(params), self.layout.views(params), on_device(params)
        B = X.shape[0]
        b = self._buf(B, params.dtype, device)
        A = self._images_nhwc(X, b.get("nhwc"), params.dtype, device)  # (B, H, W, C)
        for l, k in enumerate(self.kernels):
            h, w, _ = self.maps[l]
            c_out = self.channels[l]
            ops.im2col(A, k, k, 1, k // 2, b["cols"][l])  # (B*h*w, k*k*Cin)
            ops.dense_forward(b["cols"][l], v[f"C{l}"], v[f"c{l}"], b["Z"][l])  # (B*h*w, Cout)
            R = b["R"][l]
            ops.relu_forward(b["Z"][l], R.reshape(B * h * w, c_out))  # (B, h, w, Cout)
            ops.maxpool_forward(R, POOL, POOL, b["P"][l], b["arg"][l])  # (B, h/2, w/2, Cout)
            A = b["P"][l]
        self._dense_forward(ops, v, b["Ad"], b["Zd"])  # the head (Ad[0] views A), as the MLP's
        return b

    def loss_and_grad(self, params, X, y, grads, ready=None, buffers=None) -> float:
        """Mean cross-entropy on (X, y); writes d loss / d params into the flat `grads`.
        `ready(lo, hi, loss)`: as the MLP's, for each range of `grad_units()` in turn.
        `buffers`: ignored (the CNN has none; the keyword lets callers treat models alike)."""
        ops, v, g = self._ops_for(params), self.layout.views(params), self.layout.views(grads)
        b = self.forward(params, X)
        B = X.shape[0]
        # the head, as the MLP's layers; dAd[0] receives the gradient of its input
        dZd, dAd = b["dZd"], b["dAd"]
        loss = self._dense_loss_and_backward(ops, v, g, b["Ad"], b["Zd"], y, dZd, dAd, ready)
        dP = b["dAd"][0]  # (B, flat): the gradient of the last pooled map, NHWC flattened
        for l in range(self.n_conv - 1, -1, -1):
            h, w, _ = self.maps[l]
            ph, pw, c_out = self.maps[l + 1]
            dR = b["dR"][l]
            # P = maxpool(R)  =>  dR = dP at each window's argmax, 0 elsewhere
            ops.maxpool_backward(dP.reshape(B, ph, pw, c_out), b["arg"][l], POOL, POOL, dR)
            # R = relu(Z)  =>  dZ = dR * [Z > 0]       (rows of the NHWC map)
            dZc = b["dZ"][l]
            ops.relu_backward(b["Z"][l], dR.reshape(B * h * w, c_out), dZc)
            # Z = cols Wc + bc  =>  dWc = cols^T dZ, dbc = sum_rows dZ, dcols = dZ Wc^T
            dW, db = g[f"C{l}"], g[f"c{l}"]
            ops.dense_backward(b["cols"][l], v[f"C{l}"], dZc, dW, db, None)
            if ready is not None:  # conv layer l's gradient is final (ddp)
                ready(*self.layout.span(f"C{l}", f"c{l}"), loss)
            if l > 0:  # the first layer's input needs no gradient: dcols only above it
                ops.dense_input_grad(v[f"C{l}"], dZc, b["dcols"][l])
                k = self.kernels[l]
                ops.col2im(b["dcols"][l], k, k, 1, k // 2, b["dA"][l])  # dA = col2im(dcols)
                dP = b["dA"][l].reshape(B, h * w * self.maps[l][2])  # the pooled map before
        return loss

    # --- evaluation (off the hot path) -------------------------------------------------------

    def logits(self, params, X: np.ndarray, buffers=None) -> np.ndarray:
        """(B, n_classes) logits on the host; `buffers` ignored (the CNN has none)."""
        if on_device(params):
            params = params.copy_to_host()
        out = []
        for start in range(0, len(X), 512):  # the test set in slices: im2col's copies are big
            b = self.forward(params, X[start : start + 512])
            out.append(b["Zd"][-1].copy())
        return np.concatenate(out) if out else np.empty((0, self.n_classes), params.dtype)

    def __repr__(self) -> str:
        layers = zip(self.channels, self.kernels, strict=True)
        convs = " -> ".join(f"conv{k}x{k}:{c}" for c, k in layers)
        head = " -> ".join(map(str, self.widths))
        return f"CNN({self.image_shape} -> {convs} -> {head}, {self.n_params} params)"
