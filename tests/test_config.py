"""TrainConfig: presets, files, --key=value overrides, type checks, unknown keys."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref.config import (
    PRESETS,
    ConfigError,
    TrainConfig,
    apply_overrides,
    field_names,
    load_config_file,
)


def test_every_field_has_a_comment():
    """STYLE.md: a comment on every field of the config dataclass."""
    import inspect

    source = inspect.getsource(TrainConfig).splitlines()
    for name in field_names():
        line = next(s for s in source if s.strip().startswith(f"{name}:"))
        assert "#" in line, f"TrainConfig.{name} has no comment"


def test_presets_build_valid_configs():
    for name in PRESETS:
        cfg = TrainConfig.preset(name)
        assert isinstance(cfg, TrainConfig)
    with pytest.raises(ConfigError, match="choose one of: laptop, compare, tiny"):
        TrainConfig.preset("supercomputer")


def test_overrides_convert_types():
    cfg = apply_overrides(
        TrainConfig(),
        ["--lr=0.05", "--hidden=128,64", "--world-size=8", "--dataset=synthetic:samples=100"],
    )
    assert cfg.lr == 0.05 and cfg.hidden == (128, 64) and cfg.world_size == 8
    assert cfg.dataset == "synthetic:samples=100"
    assert apply_overrides(cfg, ["--hidden="]).hidden == ()  # no hidden layer


@pytest.mark.parametrize(
    "override, message",
    [
        ("--lr=fast", "'lr' expects a number, got 'fast'"),
        ("--steps=1.5", "'steps' expects an integer, got '1.5'"),
        ("--hidden=64,x", "'hidden' expects a comma-separated list of integers"),
        ("--world_size=0", "world_size must be >= 1"),
        ("--width=0", "width must be >= 1"),
        ("--lr=0", "lr must be a positive finite number"),
        ("--lr=nan", "lr must be a positive finite number"),
        ("--backend=cupy", "backend must be numpy or numba"),
        ("--lr", "expected an override of the form --key=value"),
    ],
)
def test_bad_values_are_rejected_with_a_reason(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        apply_overrides(TrainConfig(), [override])


def test_unknown_key_lists_valid_keys_and_suggests():
    with pytest.raises(ConfigError) as info:
        apply_overrides(TrainConfig(), ["--lrr=0.1"])
    text = str(info.value)
    assert "did you mean 'lr'?" in text
    for name in field_names():
        assert name in text


@given(st.integers(1, 64), st.floats(1e-4, 10.0), st.lists(st.integers(1, 512), max_size=3))
def test_override_round_trip(world_size, lr, hidden):
    cfg = apply_overrides(
        TrainConfig(),
        [f"--world_size={world_size}", f"--lr={lr!r}", "--hidden=" + ",".join(map(str, hidden))],
    )
    assert (cfg.world_size, cfg.lr, cfg.hidden) == (world_size, lr, tuple(hidden))
    assert TrainConfig(**{**cfg.to_dict(), "hidden": tuple(cfg.hidden)}) == cfg


def test_load_toml_and_json(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[train]\nlr = 0.25\nhidden = [32, 16]\ndataset = "synthetic"\n')
    cfg = load_config_file(toml)
    assert cfg.lr == 0.25 and cfg.hidden == (32, 16) and cfg.dataset == "synthetic"
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"world_size": 3, "steps": 10}))
    cfg = load_config_file(js, base=TrainConfig.preset("tiny"))
    assert cfg.world_size == 3 and cfg.steps == 10 and cfg.model == "softmax"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("a.toml", "lr = 'fast'\n", "'lr' expects a number"),
        ("a.toml", "lr = \n", "not valid toml"),
        ("a.json", '{"colour": 1}', "unknown config key 'colour'"),
        ("a.json", '{"steps": true}', "'steps' expects an integer"),
        ("a.yaml", "lr: 1", "expected a .toml or .json suffix"),
    ],
)
def test_bad_files_are_rejected(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "nope.toml")


def test_config_is_frozen():
    cfg = TrainConfig()
    with pytest.raises(AttributeError):
        cfg.lr = 1.0  # type: ignore[misc]
    assert cfg.staleness == 1 and cfg.lr_at(0) == cfg.lr


# --- ps_pulls, comm_first, codec_backend; the compare preset --------------------------------


def test_new_fields_default_and_override():
    cfg = TrainConfig()
    assert (cfg.ps_pulls, cfg.comm_first, cfg.codec_backend) == ("sequential", True, "numba")
    cfg = apply_overrides(cfg, ["--ps-pulls=shared", "--comm-first=false",
                                "--codec-backend=numpy"])  # fmt: skip
    assert (cfg.ps_pulls, cfg.comm_first, cfg.codec_backend) == ("shared", False, "numpy")


@pytest.mark.parametrize(
    "override, message",
    [
        ("--ps-pulls=parallel", "ps_pulls must be sequential or shared, got 'parallel'"),
        ("--ps-pulls=", "ps_pulls must be sequential or shared, got ''"),
        ("--comm-first=maybe", "config key 'comm_first' expects true or false, got 'maybe'"),
        ("--codec-backend=cuda", "codec_backend must be numpy or numba, got 'cuda'"),
    ],
)
def test_new_fields_reject_bad_values_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_new_fields_are_checked_in_files_too(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('ps_pulls = "shared"\ncomm_first = false\ncodec_backend = "numpy"\n')
    cfg = load_config_file(path)
    assert (cfg.ps_pulls, cfg.comm_first, cfg.codec_backend) == ("shared", False, "numpy")
    path.write_text("comm_first = 1\n")  # TOML has booleans: an integer is not one
    with pytest.raises(ConfigError, match="'comm_first' expects true or false"):
        load_config_file(path)


def test_compare_preset_loads_and_is_the_documented_problem():
    """config.py: digits on an MLP 64-1024-1024-10 (1.13M parameters, a 4.5 MB gradient),
    4 workers x batch 352, an emulated 700 Mbit/s link, the conventional (shared-pull) server."""
    from pipesgd_ref.models import build_model

    cfg = TrainConfig.preset("compare")
    assert (cfg.dataset, cfg.model, cfg.hidden) == ("digits", "mlp", (1024, 1024))
    assert (cfg.world_size, cfg.batch_size, cfg.eval_every) == (4, 352, 2)
    assert (cfg.latency, cfg.bandwidth, cfg.ps_pulls) == ("50us", "700Mbit", "shared")
    assert 0 < cfg.target_accuracy < 1 and cfg.steps >= 10
    n = build_model(cfg.model, 64, 10, cfg.hidden).n_params
    assert n == 64 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10 == 1_126_410
    assert TrainConfig(**{**cfg.to_dict(), "hidden": tuple(cfg.hidden)}) == cfg
