"""Models: gradients against central finite differences, the flat layout, predict/accuracy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.models import MLP, SoftmaxRegression, build_model
from pipesgd_ref.models.layout import ParamLayout
from strategies import central_differences, mlp_shapes, seeds

backends = st.sampled_from(["numpy", "numba"])


def finite_difference_grad(model, params, X, y):
    """Central differences of the loss in float64, along every coordinate."""
    scratch = np.empty_like(params)
    return central_differences(lambda w: model.loss_and_grad(w, X, y, scratch), params,
                               range(params.size))  # fmt: skip


@settings(max_examples=40)
@given(mlp_shapes, seeds, backends)
def test_gradient_matches_finite_differences(shape, seed, backend):
    n_features, hidden, n_classes, batch = shape
    model = MLP(n_features, n_classes, hidden, backend=backend)
    rng = np.random.default_rng(seed)
    params = model.init_params(seed, dtype=np.float64)
    params += rng.normal(scale=0.1, size=params.shape)  # nonzero biases: every path is exercised
    X = rng.normal(size=(batch, n_features))
    y = rng.integers(0, n_classes, size=batch)
    grads = np.full_like(params, np.nan)
    model.loss_and_grad(params, X, y, grads)
    numeric = finite_difference_grad(model, params, X, y)
    worst = np.max(np.abs(grads - numeric)) if grads.size else 0.0
    assert np.allclose(grads, numeric, rtol=1e-4, atol=1e-6), (
        f"{model} on batch {batch}: analytic gradient differs from central differences by up "
        f"to {worst:.3g} (at parameter {int(np.argmax(np.abs(grads - numeric)))})"
    )


@given(seeds)
def test_loss_and_grad_in_float32_agrees_with_float64(seed):
    model = MLP(8, 4, (16,))
    params64 = model.init_params(seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    X, y = rng.normal(size=(10, 8)), rng.integers(0, 4, size=10)
    g64, g32 = np.empty_like(params64), np.empty(model.n_params, np.float32)
    l64 = model.loss_and_grad(params64, X, y, g64)
    l32 = model.loss_and_grad(params64.astype(np.float32), X, y, g32)
    assert g32.dtype == np.float32
    assert abs(l32 - l64) < 1e-5 * max(1.0, abs(l64))
    np.testing.assert_allclose(g32, g64, rtol=1e-3, atol=1e-5)


def test_flat_layout_views_write_through():
    model = MLP(3, 2, (4,))
    assert model.n_params == 3 * 4 + 4 + 4 * 2 + 2
    params = np.zeros(model.n_params, np.float32)
    v = model.layout.views(params)
    assert v["W0"].shape == (3, 4) and v["b1"].shape == (2,)
    v["b1"][:] = 7.0
    assert np.all(params[-2:] == 7.0), "a view must write into the flat vector, not a copy"
    assert all(np.shares_memory(a, params) for a in v.values())
    with pytest.raises(ValueError, match="flat vector of 26 parameters"):
        model.layout.views(np.zeros(25, np.float32))


def test_layout_offsets_are_contiguous():
    layout = ParamLayout([("a", (2, 3)), ("b", (5,)), ("c", (1, 1))])
    assert [s.offset for s in layout.slots] == [0, 6, 11] and layout.size == 12


def test_softmax_regression_is_one_dense_layer():
    model = SoftmaxRegression(5, 3)
    assert model.n_params == 5 * 3 + 3 and model.hidden == ()
    assert isinstance(build_model("softmax", 5, 3), SoftmaxRegression)
    with pytest.raises(ValueError, match="choose one of: softmax, mlp"):
        build_model("transformer", 5, 3)
    with pytest.raises(ValueError, match="bad model shape"):
        MLP(5, 1, (4,))


def test_predict_and_accuracy():
    model = SoftmaxRegression(2, 2)
    params = np.zeros(model.n_params, np.float32)
    v = model.layout.views(params)
    v["W0"][:] = [[1, -1], [0, 0]]  # class 0 iff x0 > 0
    X = np.array([[1.0, 0.0], [-1.0, 0.0], [2.0, 5.0]], np.float32)
    np.testing.assert_array_equal(model.predict(params, X), [0, 1, 0])
    assert model.accuracy(params, X, np.array([0, 1, 1])) == pytest.approx(2 / 3)


def test_init_is_seeded():
    model = MLP(6, 3, (5,))
    np.testing.assert_array_equal(model.init_params(3), model.init_params(3))
    assert not np.array_equal(model.init_params(3), model.init_params(4))
    assert model.init_params(3).dtype == np.float32


def test_flops_per_sample_counts_one_multiply_add_per_dense_weight():
    # 784 x 120 + 120 x 84 + 84 x 10 weights, each used once per sample
    assert MLP(784, 10, (120, 84)).flops_per_sample() == 94_080 + 10_080 + 840
    assert SoftmaxRegression(64, 10).flops_per_sample() == 640
