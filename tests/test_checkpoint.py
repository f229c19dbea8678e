"""Checkpoints a person can get wrong: every unusable --resume is one ConfigError that names the
file, what is wrong with it and what to do; never a traceback, never a silent resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipesgd_ref.commands.cli import main
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime import checkpoint
from pipesgd_ref.runtime.worker import Worker

# The tiny preset: softmax regression on digits, 64 x 10 weights + 10 biases.
CFG = TrainConfig.preset("tiny").replace(steps=20)
N_PARAMS = 650


@pytest.fixture
def good(tmp_path):
    """A folder holding a well-formed checkpoint of CFG after step 9, one gradient in flight."""
    params = np.linspace(-1, 1, N_PARAMS, dtype=np.float32)
    checkpoint.save(tmp_path, CFG, params, 10, {9: np.ones(N_PARAMS, np.float32)})
    return tmp_path


def rewrite(folder, **changes):
    """The checkpoint in `folder` with arrays replaced (None: the key left out)."""
    path = folder / checkpoint.FILE
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for key, value in changes.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    np.savez(path, **arrays)


def test_a_good_checkpoint_loads(good):
    params, next_step, pending, velocity, _ = checkpoint.load(good, CFG, n_params=N_PARAMS)
    assert params.dtype == np.float32 and params.shape == (N_PARAMS,)
    assert next_step == 10 and list(pending) == [9] and velocity is None  # plain SGD: none


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"\x00garbage" * 100, "is not a checkpoint .*neither a zip archive nor an .npy"),
    ],
)
def test_empty_or_garbage_file(good, content, message):
    (good / checkpoint.FILE).write_bytes(content)
    with pytest.raises(ConfigError, match=message) as e:
        checkpoint.load(good, CFG)
    assert str(good / checkpoint.FILE) in str(e.value) and "start without --resume" in str(e.value)
    assert "allow_pickle" not in str(e.value), "numpy's advice to unpickle must not be passed on"


@pytest.mark.parametrize("keep", [0.3, 0.9])
def test_truncated_file(good, keep):
    path = good / checkpoint.FILE
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ConfigError, match="truncated or corrupt") as e:
        checkpoint.load(good, CFG)
    assert str(path) in str(e.value)


def test_a_bare_npy_is_not_a_checkpoint(good):
    with open(good / checkpoint.FILE, "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(ConfigError, match=r"single .npy array float64 \(3,\)"):
        checkpoint.load(good, CFG)


@pytest.mark.parametrize("key", checkpoint.KEYS)
def test_missing_key_is_named(good, key):
    rewrite(good, **{key: None})
    with pytest.raises(ConfigError, match=f"has no {key} "):
        checkpoint.load(good, CFG)


def test_wrong_size_for_the_model(good):
    rewrite(good, params=np.zeros(N_PARAMS + 1, np.float32),
            pending=np.zeros((1, N_PARAMS + 1), np.float32))  # fmt: skip
    with pytest.raises(ConfigError, match=f"holds {N_PARAMS + 1} parameters but this run's "
                                          f"model has {N_PARAMS}"):  # fmt: skip
        checkpoint.load(good, CFG, n_params=N_PARAMS)
    with pytest.raises(ConfigError, match="model has 650"):  # Worker passes the size
        Worker.build(CFG.replace(resume=str(good)), 0, CFG.world_size)


def test_pending_of_the_wrong_shape(good):
    rewrite(good, pending=np.zeros((1, 3), np.float32))
    with pytest.raises(ConfigError, match=r"pending gradients of shape \(1, 3\); want \(1, 650\)"):
        checkpoint.load(good, CFG)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights(good, bad):
    params = np.zeros(N_PARAMS, np.float32)
    params[7] = bad
    rewrite(good, params=params)
    with pytest.raises(ConfigError, match="1 non-finite weight.*index 7") as e:
        checkpoint.load(good, CFG)
    assert "earlier checkpoint or start without --resume" in str(e.value)


def test_non_finite_pending_gradient(good):
    rewrite(good, pending=np.full((1, N_PARAMS), np.nan, np.float32))
    with pytest.raises(ConfigError, match="non-finite pending gradient of step 9"):
        checkpoint.load(good, CFG)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(next_step=np.int64(-5)), "next_step -5"),
        (dict(next_step=np.array([1, 2])), "next_step of int64 .*want one integer"),
        (dict(pending_steps=np.array([12])), r"pending gradients of steps \[12\]"),
        (dict(params=np.array(["a"] * N_PARAMS)), "want a flat float vector"),
        (dict(config=np.array("{not json")), "unreadable config"),
        (dict(config=np.array("[1, 2]")), "not a table of keys"),
    ],
)
def test_corrupt_contents(good, changes, message):
    rewrite(good, **changes)
    with pytest.raises(ConfigError, match=message):
        checkpoint.load(good, CFG)


@pytest.mark.parametrize(
    "changes",
    [dict(codec="q8"), dict(codec="bf16", error_feedback=True), dict(lr=0.5), dict(seed=3)],
)
def test_a_different_run_is_refused_naming_each_setting(good, changes):
    """Resuming with another codec is refused too: the gradients in flight were averaged
    through the checkpoint's codec, and the result would be neither run."""
    with pytest.raises(ConfigError, match="from a different run") as e:
        checkpoint.load(good, CFG.replace(**changes))
    for key, value in changes.items():
        assert f"{key}: {getattr(CFG, key)!r} in the checkpoint, {value!r} now" in str(e.value)


def test_an_older_checkpoint_without_the_codec_keys_means_the_defaults(good):
    with np.load(good / checkpoint.FILE) as z:
        saved = json.loads(str(z["config"]))
    for key in ("codec", "error_feedback", "codec_pull"):
        saved.pop(key)
    rewrite(good, config=np.array(json.dumps(saved)))
    checkpoint.load(good, CFG)  # codec none, no feedback, no pull codec: the defaults
    with pytest.raises(ConfigError, match="codec: 'none' in the checkpoint, 'q8' now"):
        checkpoint.load(good, CFG.replace(codec="q8"))


def test_float64_weights_are_converted(good):
    rewrite(good, params=np.zeros(N_PARAMS, np.float64))
    params = checkpoint.load(good, CFG).params
    assert params.dtype == np.float32


def test_resume_names_a_file_instead_of_its_folder(good):
    with pytest.raises(ConfigError, match=f"that is a file; .*e.g. --resume {good}"):
        checkpoint.load(good / checkpoint.FILE, CFG)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 cut short"])
def test_train_resume_of_a_bad_checkpoint_is_one_line_and_rc_2(good, content, capsys):
    (good / checkpoint.FILE).write_bytes(content)
    rc = main(["train", "--preset=tiny", "--steps=30", "--no-progress", f"--resume={good}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesgd: error: --resume: "), err
    assert str(good / checkpoint.FILE) in lines[0]


# A CNN on digits whose two architectures have the same number of parameters (their weights
# would load into each other's slots without complaint, and train on as noise).
CNN_A = CFG.replace(model="cnn", channels=(2, 6), kernels=(5, 3), hidden=(16,))
CNN_B = CNN_A.replace(channels=(7, 2), kernels=(3, 5))


def _n_params(cfg):
    from pipesgd_ref.data import load_dataset
    from pipesgd_ref.models import model_for

    return model_for(cfg, load_dataset(cfg.dataset)).n_params


def test_a_cnn_checkpoint_does_not_resume_into_another_architecture(tmp_path, capsys):
    n = _n_params(CNN_A)
    assert _n_params(CNN_B) == n  # the case a size check cannot see
    checkpoint.save(tmp_path, CNN_A, np.zeros(n, np.float32), 10, {})
    with pytest.raises(ConfigError, match="from a different run") as e:
        checkpoint.load(tmp_path, CNN_B, n_params=n)
    assert "channels: [2, 6] in the checkpoint, [7, 2] now" in str(e.value)
    assert "kernels: [5, 3] in the checkpoint, [3, 5] now" in str(e.value)
    args = ["train", "--preset=tiny", "--steps=20", "--no-progress", "--model=cnn"]
    args += ["--hidden=16", "--channels=7,2", "--kernels=3,5", f"--resume={tmp_path}"]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesgd: error: --resume "), err
    assert "channels: [2, 6] in the checkpoint, [7, 2] now" in lines[0]


def test_every_field_a_model_is_built_from_is_checked_on_resume():
    """model_for reads the config through a recorder: every field it reads (for each model)
    must be among the keys a resume checks, and build_model can take no option that is not a
    config field checked there. A new model option left out of MODEL_FIELDS fails here."""
    import inspect

    from pipesgd_ref.data import load_dataset
    from pipesgd_ref.models import MODEL_FIELDS, MODELS, build_model, model_for

    class Recorder:
        def __init__(self, cfg):
            self._cfg, self.read = cfg, set()

        def __getattr__(self, name):
            self.read.add(name)
            return getattr(self._cfg, name)

    data = load_dataset(CFG.dataset)
    for name in MODELS:
        cfg = Recorder(CFG.replace(model=name))
        model_for(cfg, data)
        assert cfg.read <= set(checkpoint.MUST_MATCH), (name, cfg.read - set(MODEL_FIELDS))
    from_the_data = {"name", "n_features", "n_classes", "backend", "image_shape"}
    options = set(inspect.signature(build_model).parameters) - from_the_data
    assert options <= set(MODEL_FIELDS) <= set(checkpoint.MUST_MATCH), options
    assert set(MODEL_FIELDS) - {"model"} <= set(TrainConfig.__dataclass_fields__)


def _npz_with_member(good, key, npy_bytes):
    """The checkpoint in `good` with member `key` replaced by raw .npy bytes."""
    import zipfile

    path = good / checkpoint.FILE
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    members[key + ".npy"] = npy_bytes
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _npy_header(shape, dtype=np.float32) -> bytes:
    import io

    f = io.BytesIO()
    fmt = np.lib.format
    header = {"descr": fmt.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
    fmt.write_array_header_1_0(f, {**header, "shape": shape})
    return f.getvalue()


@pytest.mark.parametrize("n_params", [None, N_PARAMS])
def test_a_header_declaring_10_to_the_13_numbers_is_refused_before_allocating(good, n_params):
    _npz_with_member(good, "params", _npy_header((10**13,)) + b"\0" * 64)
    with pytest.raises(ConfigError) as e:
        checkpoint.load(good, CFG, n_params=n_params)
    message = str(e.value)
    if n_params is None:
        assert "declares params of float32 (10000000000000,) (40000000000000 bytes)" in message
        assert "holds 64 bytes: it is corrupt or crafted" in message
    else:
        assert f"holds 10000000000000 parameters but this run's model has {N_PARAMS}" in message


def test_a_member_declaring_more_bytes_than_the_file_holds_is_refused(good):
    _npz_with_member(good, "pending", _npy_header((1, 10**12)))
    with pytest.raises(ConfigError, match=r"declares pending of float32 \(1, 1000000000000\)"):
        checkpoint.load(good, CFG, n_params=N_PARAMS)


def test_an_object_array_is_refused_for_what_it_is(good):
    rewrite(good, params=np.array([1, "a", None], dtype=object))
    with pytest.raises(ConfigError, match=r"holds Python objects in params \(object\)") as e:
        checkpoint.load(good, CFG)
    assert "neither a zip" not in str(e.value) and "allow_pickle" not in str(e.value)


def test_train_resume_of_a_crafted_checkpoint_is_one_line(good, capsys):
    _npz_with_member(good, "params", _npy_header((10**13,)))
    rc = main(["train", "--preset=tiny", "--steps=30", "--no-progress", f"--resume={good}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "MemoryError" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "holds 10000000000000 parameters" in lines[0], err


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_a_full_disk_during_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    """ENOSPC inside np.savez: an OutputError naming the checkpoint and the space it needed
    (the CLI's one line; not retried by --max-restarts), and no checkpoint.npz.tmp."""
    from pipesgd_ref.errors import OutputError

    monkeypatch.setattr(checkpoint.np, "savez", _disk_full)
    with pytest.raises(OutputError, match=r"checkpoint\.npz.*disk is full: it needs"):
        checkpoint.save(tmp_path, TrainConfig(), np.zeros(1000, np.float32), 5, {})
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_write_text_atomic_names_the_file(tmp_path, monkeypatch):
    from pipesgd_ref import outputs
    from pipesgd_ref.errors import OutputError

    monkeypatch.setattr(outputs.os, "replace", _disk_full)
    with pytest.raises(OutputError, match=r"trace\.json.*disk is full: it needs 5 bytes"):
        outputs.write_text_atomic(tmp_path / "trace.json", "12345")
    assert list(tmp_path.iterdir()) == []
