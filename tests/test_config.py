"""TrainConfig: presets, files, --key=value overrides, type checks, unknown keys."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref.config import PRESETS, TrainConfig, apply_overrides, field_names, load_config_file
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime import preflight


def test_every_field_has_a_comment():
    """Every field of the config dataclass has a comment saying what it does."""
    import inspect

    source = inspect.getsource(TrainConfig).splitlines()
    for name in field_names():
        line = next(s for s in source if s.strip().startswith(f"{name}:"))
        assert "#" in line, f"TrainConfig.{name} has no comment"


def test_presets_build_valid_configs():
    """Each preset is the default config with the values it names, and nothing else changed;
    it passes the checks (each field on construction, the rest in the preflight) and survives
    the round trip through the dict a summary stores."""
    default = TrainConfig().to_dict()
    for name, values in PRESETS.items():
        cfg = TrainConfig.preset(name)
        preflight.check_config(cfg)
        named = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        assert cfg.to_dict() == default | named, f"preset {name!r}"
        assert TrainConfig().replace(**cfg.to_dict()) == cfg, f"preset {name!r} round trip"
    every = "laptop, compare, compare-cnn, compare-cnn-compute, compare-resnet, tiny"
    with pytest.raises(ConfigError, match=f"choose one of: {every}"):
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
    with pytest.raises(ConfigError, match=re.escape(message)):
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
    cfg = apply_overrides(cfg, ["--ps-pulls=shared", "--comm-first=false", "--codec-backend=numpy"])
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
    with pytest.raises(ConfigError, match=message):  # ps_pulls: the server's list (preflight)
        preflight.check_config(apply_overrides(TrainConfig(), [override]))


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
    4 workers x batch 352, an emulated link of 50 us whose bandwidth compare chooses for the
    machine (none named here), the conventional (shared-pull) server."""
    from pipesgd_ref.models import build_model

    cfg = TrainConfig.preset("compare")
    assert (cfg.dataset, cfg.model, cfg.hidden) == ("digits", "mlp", (1024, 1024))
    assert (cfg.world_size, cfg.batch_size, cfg.eval_every) == (4, 352, 2)
    assert (cfg.latency, cfg.bandwidth, cfg.ps_pulls) == ("50us", "inf", "shared")
    assert "bandwidth" not in PRESETS["compare"] and "bandwidth" not in PRESETS["compare-cnn"]
    assert PRESETS["compare-cnn-compute"]["bandwidth"] == "10Gbit", "the compute-bound contrast"
    assert 0 < cfg.target_accuracy < 1 and cfg.steps >= 10
    n = build_model(cfg.model, 64, 10, cfg.hidden).n_params
    assert n == 64 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10 == 1_126_410
    assert TrainConfig(**{**cfg.to_dict(), "hidden": tuple(cfg.hidden)}) == cfg


# --- bad input that must be one line (issue 18) ---------------------------------------------


def test_config_file_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; --config takes a .toml or .json file"):
        load_config_file(tmp_path)


def test_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "run.toml"
    path.write_bytes("lr = 0.1\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"'.*run.toml' is not UTF-8 text \(byte 0xe9 at offset"):
        load_config_file(path)


@pytest.mark.parametrize(
    "timeout, shown",
    [("0", "0"), ("-1", "-1"), ("nan", "nan"), ("inf", "inf"), ("1e12", "1e.12"),
     ("1e-9", "1e-09"), ("0.5", "0.5")],
)  # fmt: skip
def test_timeout_must_be_positive_and_bounded(timeout, shown):
    # 1e12 s would reach queue.get and time.sleep as an OverflowError inside every worker; under
    # a second, a healthy job on a busy host fails blaming a peer (issue 29, 15)
    with pytest.raises(
        ConfigError, match=f"timeout must be at least 1 s .* at most 1e.06 s .*got {shown}"
    ):
        apply_overrides(TrainConfig(), [f"--timeout={timeout}"])


def test_latency_beyond_any_sleep_is_refused():
    with pytest.raises(ConfigError, match="latency '1e12s' is 1e.12 s per message, more than"):
        preflight.check_config(apply_overrides(TrainConfig(), ["--latency=1e12s"]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["--latency=10s", "--timeout=3"],
            "a ring segment .* takes 10.00 s at --latency 10.00 s and --bandwidth unlimited, more "
            "than --timeout 3 s; lower --latency",
        ),
        (
            ["--bandwidth=1bit", "--timeout=3"],
            r"a ring segment \(325 values: the 650-value gradient in 2 chunks\) takes 10784.00 s "
            r"at --latency 0 us and --bandwidth 1 bit/s \(0.125 B/s\), more than --timeout 3 s; "
            r"raise --bandwidth",
        ),
        (["--bandwidth=1Kbit", "--timeout=5"], "takes 10.78 s .*--bandwidth 1 Kbit/s"),
    ],
)
def test_a_link_slower_than_the_timeout_is_refused_before_the_first_step(overrides, message):
    """The tiny preset: 650 parameters, 2 ranks: a ring segment of 325 values, 1348 bytes."""
    cfg = apply_overrides(TrainConfig.preset("tiny"), overrides)  # a valid config on its own
    preflight.check_config(cfg)
    with pytest.raises(ConfigError, match=message):
        preflight.check_link_against_timeout(cfg, 650)


def test_a_one_rank_ring_never_uses_its_link():
    slow = ["--world-size=1", "--latency=10s", "--timeout=3"]
    preflight.check_link_against_timeout(apply_overrides(TrainConfig(), slow), 650)
    with pytest.raises(ConfigError, match="server's one link"):  # a server and one worker do
        server = apply_overrides(TrainConfig(), [*slow, "--algo=ps-sync"])
        preflight.check_link_against_timeout(server, 650)


@pytest.mark.parametrize("algo", ["sync", "ps-sync", "ps-async"])
def test_width_does_nothing_without_the_pipe(algo):
    with pytest.raises(ConfigError, match=f"width 3 does nothing with --algo {algo}"):
        preflight.check_config(apply_overrides(TrainConfig(), [f"--algo={algo}", "--width=3"]))
    for width in ("1", "2"):  # what compare sets, and the default
        preflight.check_config(
            apply_overrides(TrainConfig(), [f"--algo={algo}", f"--width={width}"])
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--error-feedback=true"], "--error-feedback adds back what the codec dropped"),
        (
            ["--codec-pull=q8"],
            "--codec-pull q8 compresses a parameter server's pulls, and --algo pipe has no server",
        ),
        (["--algo=sync", "--warmup-steps=3"], "--warmup-steps 3: .*sync has no pipeline"),
        (["--width=1", "--warmup-steps=3"], "with --width 1: a pipe of width 1 is synchronous"),
        (["--checkpoint-every=5"], "--checkpoint-every 5 writes checkpoints into --out"),
        (["--model=softmax", "--hidden=32"], "--hidden 32 does nothing with --model softmax"),
        (["--width=1000", "--steps=3"], "--width 1000 with --steps 3: the pipeline never fills"),
        # issue 29, 16
        (["--algo=sync", "--ps-pulls=shared"], "--ps-pulls shared orders a parameter server's"),
        (["--warmup-steps=1000", "--steps=10"], "every step is a synchronous warm-up step"),
        (["--warmup-steps=10", "--steps=10"], "every step is a synchronous warm-up step"),
    ],
)
def test_options_that_would_do_nothing_are_refused(overrides, message):
    cfg = apply_overrides(TrainConfig(), overrides)  # each is a valid config on its own
    preflight.check_config(cfg)
    with pytest.raises(ConfigError, match=message):
        preflight.check_idle_options(cfg)


def test_presets_and_compare_runs_have_no_idle_options_and_fit_the_link():
    """Every preset, and every run `pipesgd compare` (--quick too) derives from its preset,
    passes the checks of a training run."""
    from pipesgd_ref.commands.compare import quick_config, run_config
    from pipesgd_ref.data import load_dataset
    from pipesgd_ref.timing import COMPARE_RUNS

    for name in PRESETS:
        cfg = TrainConfig.preset(name)
        data = load_dataset(cfg.dataset)
        preflight.check_config(cfg)
        preflight.check_run(cfg, preflight.n_params_of(cfg, data))
        preflight.check_idle_options(cfg, cfg)  # compare's ps_pulls: the preset's, not asked
    base = TrainConfig.preset("compare")
    for cfg in (base, quick_config(base)):
        for algo, codec in COMPARE_RUNS:
            run = run_config(cfg, algo, codec, None)
            preflight.check_config(run)
            preflight.check_idle_options(run, base)
            preflight.check_run(run, preflight.n_params_of(run, load_dataset(run.dataset)))
    # the options accepted by compare's base config stay valid for every derived run
    loud = base.replace(error_feedback=True, warmup_steps=2, codec_pull="q8")
    for algo, codec in COMPARE_RUNS:
        preflight.check_config(run_config(loud, algo, codec, None))


# --- the emulated link against --timeout: the run's slowest frame ---------------------------


def _n_params(cfg):
    from pipesgd_ref.data import load_dataset

    return preflight.n_params_of(cfg, load_dataset(cfg.dataset))


@pytest.mark.parametrize(
    "overrides, message",
    [
        # the compare preset: 1126410 parameters, 4 ranks: a chunk of 281603 values (1.1 MB)
        (
            ["--bandwidth=1Kbit"],
            r"a ring segment \(281603 values: the 1126410-value gradient in 4 chunks\) takes "
            r"9011.68 s at --latency 50 us and "
            r"--bandwidth 1 Kbit/s .*more than --timeout 60 s; raise --bandwidth",
        ),
        (["--bandwidth=1Kbit", "--codec=q8"], r"q8-coded\) takes 2253.24 s"),
        (
            ["--bandwidth=10Mbit", "--algo=ps-sync", "--timeout=1"],
            r"a pull of the weights \(4.5 MB\) behind the pushes .* of all 4 workers on the "
            r"server's one link takes 28.84 s .*--timeout 1 s",
        ),
        (
            ["--latency=30s", "--bandwidth=1Gbit", "--algo=ps-async"],
            "takes 60.29 s at --latency 30.00 s .*--timeout 60 s; lower --latency",
        ),
    ],
)
def test_check_link_against_timeout_names_frame_latency_bandwidth_timeout(overrides, message):
    cfg = apply_overrides(TrainConfig.preset("compare"), overrides)
    with pytest.raises(ConfigError, match=message):
        preflight.check_link_against_timeout(cfg, _n_params(cfg))


def test_slowest_frame_of_the_ring_is_one_segment_of_one_chunk():
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES
    from pipesgd_ref.comm.wire import HEADER_BYTES
    from pipesgd_ref.runtime.preflight import check_link_against_timeout, slowest_frame

    cfg = TrainConfig.preset("compare").replace(bandwidth="1Gbit", latency="0")
    _, nbytes, seconds = slowest_frame(cfg, 10)  # ceil(10 / 4) = 3 values
    assert nbytes == 3 * 4 + HEADER_BYTES and seconds == pytest.approx(nbytes / 125e6)
    _, nbytes, _ = slowest_frame(cfg, 10**9)  # chunks of 250M values travel in 2 MiB segments
    assert nbytes == SEGMENT_BYTES + HEADER_BYTES
    assert slowest_frame(cfg.replace(world_size=1), 10**9) == ("", 0, 0.0)
    check_link_against_timeout(cfg.replace(bandwidth="1bit", timeout=1e6), 10)  # 60 B: 480 s


def test_check_memory_refuses_a_model_beyond_this_machine(monkeypatch):
    from pipesgd_ref import data
    from pipesgd_ref.runtime.preflight import check_memory

    monkeypatch.setattr(data, "physical_memory", lambda: 8 * 10**9)
    cfg = TrainConfig.preset("laptop").replace(hidden=(100_000_000,))
    message = (
        r"--hidden 100000000 on digits: 7500000010 parameters \(30.0 GB a copy\); 4 local "
        r"processes keep at least 4 copies each, 480.0 GB, more than this machine's 8.0 GB"
    )
    with pytest.raises(ConfigError, match=message):
        check_memory(cfg, _n_params(cfg))
    check_memory(TrainConfig.preset("laptop"), _n_params(TrainConfig.preset("laptop")))


@pytest.mark.parametrize(
    "override, message",
    [
        ("--lr-decay=nan", "lr_decay must be a finite number >= 0, got nan"),
        ("--lr-decay=inf", "lr_decay must be a finite number >= 0, got inf"),
        ("--epochs=nan", "epochs must be a finite number >= 0, got nan"),
        ("--epochs=inf", "epochs must be a finite number >= 0, got inf"),
        ("--seed=-1", "seed must be >= 0"),
    ],
)
def test_non_finite_schedules_and_negative_seeds_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_config_file_that_is_not_a_regular_file():
    with pytest.raises(ConfigError, match="'/dev/null' is not a regular file"):
        load_config_file("/dev/null")


def test_config_file_with_a_train_table_and_more(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nlr = 0.1\n[other]\nx = 1\n")
    with pytest.raises(
        ConfigError, match=r"a \[train\] table and other keys beside it \('other'\)"
    ):
        load_config_file(path)


def test_emulated_allreduce_seconds_is_2_p_minus_1_chunk_times():
    """What the pipe's compute thread must wait beyond --timeout for a whole AllReduce: with
    world size 4 and 2333 bit/s, each frame of 700 B takes 2.4 s (within --timeout 4), the
    AllReduce 6 of them, 14.4 s: more than 2 x --timeout + 5 s."""
    from pipesgd_ref.timing.emulated import emulated_allreduce_seconds

    cfg = TrainConfig.preset("tiny").replace(world_size=4, bandwidth="2333bit", timeout=4.0)
    chunk = -(-650 // 4) * 4 + 48  # 163 float32 values and one header
    assert emulated_allreduce_seconds(cfg, 650) == pytest.approx(6 * chunk / (2333 / 8))
    assert emulated_allreduce_seconds(cfg, 650) > 2 * cfg.timeout + 5
    q8 = emulated_allreduce_seconds(cfg.replace(codec="q8"), 650)
    assert q8 == pytest.approx(6 * (4 + 163 + 48) / (2333 / 8))
    assert emulated_allreduce_seconds(cfg.replace(world_size=1), 650) == 0.0
    assert emulated_allreduce_seconds(cfg.replace(bandwidth="inf"), 650) == 0.0
    big = emulated_allreduce_seconds(cfg.replace(bandwidth="1Gbit"), 4 * 10**9)  # 2 MiB pieces
    segments = -(-(10**9) // ((2 << 20) // 4))
    assert big == pytest.approx(6 * (4 * 10**9 + segments * 48) / 125e6)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"steps": 1e308}, "steps must be at most 1,000,000,000, got 1e+308"),
        ({"checkpoint_every": 1e30}, "checkpoint_every must be at most"),
        ({"max_restarts": 1e9}, "max_restarts must be at most 1,000, got 1e+09"),
        ({"seed": 2**64}, "seed must be at most 9,223,372,036,854,775,807"),
        ({"hidden": [10**12]}, "hidden must be at most"),
        ({"epochs": 1e300}, "epochs must be at most"),
        ({"steps": 1.5}, "'steps' expects an integer"),
    ],
)
def test_huge_or_fractional_integers_are_refused_from_a_file_too(tmp_path, values, message):
    """A JSON number is a float, whole however large: 1e308 steps would train without end."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config_file(path)


def test_the_bounds_leave_ordinary_values_alone():
    cfg = TrainConfig().replace(steps=10**9, seed=2**63 - 1, max_restarts=1000)
    assert cfg.steps == 10**9 and cfg.seed == 2**63 - 1


def test_a_presets_own_values_are_not_options_asked_for():
    """--preset compare sets ps_pulls shared for its ps-sync run: a train of it with --algo sync
    is not refused for it, the same option given on a plain run is (issue 29, 16)."""
    compare = TrainConfig.preset("compare")
    preflight.check_idle_options(compare.replace(algo="sync"), compare)
    with pytest.raises(ConfigError, match="--ps-pulls shared"):
        preflight.check_idle_options(TrainConfig().replace(algo="sync", ps_pulls="shared"))
    preflight.check_idle_options(TrainConfig().replace(warmup_steps=9, steps=10))


@pytest.mark.parametrize("bind, joined, comm, where", [
    ("lo", False, "sockets", "local workers"), ("eth0", True, "mpi", "MPI library")
])  # fmt: skip
def test_bind_where_no_listener_is_placed_is_refused(bind, joined, comm, where):
    with pytest.raises(ConfigError, match=f"--bind {bind} places the listeners.*{where}"):
        preflight.check_bind(bind, joined, comm)
    preflight.check_bind(bind, True, "sockets")
    preflight.check_bind(None, False, comm)


# --- the residual net's options: depth, and channels resolved per model ------------------------


def test_channels_default_to_the_models_own_widths():
    """channels () means the model's default: LeNet-5's (6, 16) for cnn/mlp/softmax, exactly as
    before (to_dict and every result unchanged), (16, 32, 64) for the resnet; changing --model
    takes the new model's default unless --channels is given."""
    assert TrainConfig().channels == (6, 16) and TrainConfig().to_dict()["channels"] == [6, 16]
    assert TrainConfig(model="resnet").channels == (16, 32, 64)
    assert TrainConfig().replace(model="resnet").channels == (16, 32, 64)
    assert TrainConfig.preset("compare-cnn").replace(model="resnet").channels == (16, 32, 64)
    assert TrainConfig(model="resnet").replace(model="cnn").channels == (6, 16)
    given_ = apply_overrides(TrainConfig(), ["--model=resnet", "--channels=8,16,32"])
    assert given_.channels == (8, 16, 32) and given_.replace(depth=14).channels == (8, 16, 32)
    assert TrainConfig(**json.loads(json.dumps(TrainConfig().to_dict()))) == TrainConfig()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(depth=9), "depth must be 6n + 2 with n >= 1 (8, 14, 20, ...), got 9"),
        (dict(depth=2), "depth must be 6n + 2"),
        (dict(model="resnet", channels=(6, 16)), "resnet takes 3 widths >= 1, one per stage"),
        (dict(model="resnet", channels=(8, 0, 8)), "resnet takes 3 widths"),
        (dict(model="vgg"), "model must be one of softmax, mlp, cnn, resnet"),
    ],
)
def test_the_resnets_options_are_checked(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**changes)
    assert TrainConfig(model="resnet", depth=20).depth == 20
