"""--allreduce (TrainConfig.allreduce) and --transport auto, the defaults: the names checked,
the combinations no job can run refused with their reasons (runtime/preflight.py), the field
carried by presets, files and round trips, and handed to the job's JobSpec (runtime/job.py's
`job_allreduce`: auto means the ring wherever only the ring runs)."""

from __future__ import annotations

import inspect
import json

import pytest

from pipesgd_ref.comm.rendezvous import ALLREDUCE, JobSpec
from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.parser import build_parser, resolve_config
from pipesgd_ref.config import PRESETS, TrainConfig, apply_overrides, load_config_file
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime import preflight
from pipesgd_ref.runtime.job import job_allreduce
from pipesgd_ref.runtime.jobenv import join_from_env


def test_auto_is_the_default_transport_and_allreduce_of_a_run_and_of_a_joined_rank():
    cfg = TrainConfig()
    assert (cfg.transport, cfg.allreduce) == ("auto", "auto")
    assert JobSpec(0, 1).transport == "auto"
    assert JobSpec(0, 1).allreduce == "ring", "the library's default stays the paper's ring"
    params = inspect.signature(join_from_env).parameters
    assert params["transport"].default == "auto" and params["allreduce"].default == "ring"
    for name in PRESETS:  # no preset pins the old default
        assert TrainConfig.preset(name).transport == "auto", name
        assert TrainConfig.preset(name).allreduce == "auto", name


@pytest.mark.parametrize("name", ALLREDUCE)
def test_every_algorithm_of_the_jobspec_is_a_valid_config(name):
    cfg = apply_overrides(TrainConfig(), [f"--allreduce={name}"])
    preflight.check_config(cfg)
    assert cfg.allreduce == name and JobSpec(0, 1, allreduce=job_allreduce(cfg))


def test_an_unknown_algorithm_is_refused_listing_the_choices():
    cfg = apply_overrides(TrainConfig(), ["--allreduce=butterfly"])
    with pytest.raises(ConfigError) as info:
        preflight.check_config(cfg)
    assert f"allreduce must be one of {', '.join(ALLREDUCE)}, got 'butterfly'" in str(info.value)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["--comm=mpi", "--allreduce=rd"], ("--allreduce rd with --comm mpi", "ring over MPI")),
        (["--comm=mpi", "--allreduce=oneshot"], ("--allreduce oneshot with --comm mpi",)),
        (["--codec=q8", "--allreduce=rab"], ("--allreduce rab with --codec q8", "compressed ring")),
        (["--codec=bf16", "--allreduce=twoshot"], ("--codec bf16", "no compressed form")),
        (["--device=cuda", "--allreduce=rd"], ("--allreduce rd with --device cuda", "device ring")),
        (["--latency=1ms", "--allreduce=oneshot"], ("--latency 1ms", "bypassing the links")),
        (["--bandwidth=1Gbit", "--allreduce=twoshot"], ("--bandwidth 1Gbit", "pace nothing")),
        (["--transport=tcp", "--allreduce=oneshot"], ("--transport tcp", "shm or auto")),
        (["--transport=unix", "--allreduce=twoshot"], ("--transport unix", "shm or auto")),
    ],
)
def test_an_algorithm_the_job_cannot_run_is_refused_saying_why(overrides, words):
    cfg = apply_overrides(TrainConfig(), overrides)
    with pytest.raises(ConfigError) as info:
        preflight.check_config(cfg)
    assert all(w in str(info.value) for w in words), info.value


@pytest.mark.parametrize(
    "overrides",
    [
        ["--comm=mpi"],  # auto under MPI: the ring over MPI
        ["--comm=mpi", "--allreduce=ring"],
        ["--comm=mpi", "--transport=tcp"],  # the default until now: a saved config still runs
        ["--codec=q8"],  # auto with a codec: the compressed ring
        ["--codec=q8", "--allreduce=ring"],
        ["--latency=1ms", "--allreduce=rd"],  # rd and rab run over (emulated) links
        ["--latency=1ms", "--allreduce=rab"],
        ["--latency=1ms"],  # auto on an emulated link: never the group that bypasses it
        ["--transport=shm", "--allreduce=oneshot"],
    ],
)
def test_what_the_job_can_run_is_accepted(overrides):
    preflight.check_config(apply_overrides(TrainConfig(), overrides))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "auto"),
        (["--allreduce=rd"], "rd"),
        (["--codec=q8"], "ring"),
        (["--comm=mpi"], "ring"),
        (["--device=cuda"], "ring"),
        (["--algo=ps-sync"], "ring"),  # a server's job has no AllReduce to choose
        (["--algo=ps-async", "--allreduce=rd"], "ring"),
    ],
)
def test_auto_means_the_ring_wherever_only_the_ring_runs(overrides, expected):
    assert job_allreduce(apply_overrides(TrainConfig(), overrides)) == expected


def test_a_server_method_refuses_an_algorithm_it_would_not_use():
    cfg = apply_overrides(TrainConfig(), ["--algo=ps-sync", "--allreduce=rab"])
    preflight.check_config(cfg)
    with pytest.raises(ConfigError, match="--allreduce rab picks the AllReduce of the ring"):
        preflight.check_idle_options(cfg)
    preflight.check_idle_options(cfg.replace(allreduce="ring"))


def test_the_field_travels_through_files_round_trips_and_compare_runs(tmp_path):
    from pipesgd_ref.commands.compare import run_config

    cfg = TrainConfig().replace(allreduce="rab", transport="tcp")
    again = TrainConfig(**json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.to_dict()["allreduce"] == "rab"
    toml = tmp_path / "run.toml"
    toml.write_text('[train]\nallreduce = "twoshot"\ntransport = "shm"\n')
    assert load_config_file(toml).allreduce == "twoshot"
    (tmp_path / "run.json").write_text(json.dumps({"allreduce": "rd"}))
    assert load_config_file(tmp_path / "run.json").allreduce == "rd"
    with pytest.raises(ConfigError, match="'allreduce' expects a string"):
        load_config_file(_written(tmp_path / "bad.toml", "allreduce = 2\n"))
    # compare: the codec runs are the compressed ring whatever the others use
    assert run_config(cfg, "pipe", "none", None).allreduce == "rab"
    assert run_config(cfg, "pipe", "q8", None).allreduce == "ring"


def _written(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["train", "compare"])
def test_the_command_line_passes_allreduce_and_transport_to_the_config(command):
    args, rest = build_parser().parse_known_args(
        [command, "--allreduce", "ring", "--transport=unix"]
    )
    cfg = resolve_config(args, rest)
    assert (cfg.allreduce, cfg.transport) == ("ring", "unix")
    args, rest = build_parser().parse_known_args([command])
    assert resolve_config(args, rest).allreduce == "auto"


def test_train_with_allreduce_ring_runs_and_reports_it(tmp_path, capsys):
    """A `pipesgd train` smoke run (test_cli.py's tiny sync run): the settings it ran with are
    in its first line and in summary.json."""
    argv = ["train", "--preset=tiny", "--algo=sync", "--no-progress", "--steps=4"]
    assert main([*argv, "--allreduce", "ring", f"--out={tmp_path}"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "transport auto, allreduce ring" in first, first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 4
    assert (summary["config"]["allreduce"], summary["config"]["transport"]) == ("ring", "auto")


def _rewritten_models_job(comm, path: str, nbytes: int) -> list[str]:
    """Reduce nbytes once; rank 0 then rewrites the models file to make the ring free and the
    others slow, and every rank reduces a new size: what ran, in order."""
    import numpy as np

    from pipesgd_ref.comm.collectives import allreduce

    allreduce(comm, np.ones(nbytes // 4, np.float32))
    if comm.rank == 0:
        slow = {"alpha": 1.0, "beta": 1.0}
        models = {"tcp": {"ring": {"alpha": 0.0, "beta": 0.0}, "rd": slow, "rab": slow}}
        with open(path, "w") as f:
            json.dump({"models": models}, f)
    allreduce(comm, np.ones(2, np.float64))  # everyone past the rewrite
    allreduce(comm, np.ones(nbytes // 4 + 1, np.float32))  # a size met after it
    return [e["algorithm"] for e in comm.allreduce_ran()]


def test_a_models_file_rewritten_during_a_job_does_not_change_its_choices(tmp_path, monkeypatch):
    """Issue 41: a fit written while a job ran stopped that job (each rank re-read the file,
    and a size first met after the rewrite was chosen by other figures). The job's figures are
    the ones rank 0 read at rendezvous."""
    from pipesgd_ref.comm import choose
    from pipesgd_ref.runtime.launch import launch_local

    path = tmp_path / "models.json"
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(path))  # none yet: the package's
    nbytes = 64 * 1024
    want = choose.pick(["ring", "rd", "rab"], 2, nbytes + 4, choose.job_models()["tcp"])
    assert want != "ring", "pick a size where the package's figures do not choose the ring"
    ran = launch_local(2, _rewritten_models_job, (str(path), nbytes), allreduce="auto",
                       transport="tcp", start_method="fork")  # fmt: skip
    assert path.is_file()
    assert ran[0] == ran[1] and ran[0][-1] == want, ran


def _broken_models(tmp_path, kind: str):
    path = tmp_path / "models.json"
    good = {"models": {"shm": {"ring": {"alpha": 1e-5, "beta": 1e-10}}}}
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink into /proc":
        path.symlink_to("/proc/self/mem")
    elif kind == "huge":
        path.write_text(json.dumps(good) + " " * (2 << 20))
    else:
        text = {
            "empty": "",
            "truncated": json.dumps(good)[:30],
            "wrong types": '{"models": {"shm": {"ring": {"alpha": "fast", "beta": 1}}}}',
            "missing keys": '{"models": {"shm": {"ring": {"alpha": 1e-5}}}}',
            "not an object": "[1, 2]",
            "negative": '{"models": {"tcp": {"rd": {"alpha": -1, "beta": 0}}}}',
        }[kind]
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    "kind",
    ["empty", "truncated", "wrong types", "missing keys", "not an object", "negative",
     "directory", "symlink into /proc", "huge"],
)  # fmt: skip
def test_a_broken_models_file_is_one_line_naming_it_before_any_worker(
    tmp_path, monkeypatch, capsys, kind
):
    """Issue 41: a malformed allreduce_models.json was a traceback per rank that never named
    the file, and a bad file in the user's cache broke every default `pipesgd train`. Now it
    is one line naming the file and what is wrong, exit 2, before any worker starts."""
    path = _broken_models(tmp_path, kind)
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(path))
    out = tmp_path / "out"
    argv = ["train", "--preset=tiny", "--no-progress", "--steps=4", f"--out={out}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipesgd: error: AllReduce models file {path}"), err
    assert err.count("\n") == 1 and "Traceback" not in err and "rank" not in err, err
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("kind", ["truncated", "symlink into /proc"])
def test_a_broken_models_file_in_the_users_cache_is_one_line(tmp_path, monkeypatch, capsys, kind):
    """The default place, ~/.cache/pipesgd/allreduce_models.json (no $PIPESGD_ALLREDUCE_MODELS):
    a bad file there broke every default `pipesgd train`; now one line naming it, exit 2."""
    home = tmp_path / "home"
    cache = home / ".cache" / "pipesgd"
    cache.mkdir(parents=True)
    _broken_models(tmp_path, kind).rename(cache / "allreduce_models.json")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PIPESGD_ALLREDUCE_MODELS", raising=False)
    argv = ["train", "--preset=tiny", "--no-progress", "--steps=4", f"--out={tmp_path / 'out'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipesgd: error: AllReduce models file {cache}/allreduce_models.json"), (
        err
    )
    assert err.count("\n") == 1, err


def test_a_models_file_named_but_missing_is_said_once_and_the_job_trains(
    tmp_path, monkeypatch, capsys
):
    """$PIPESGD_ALLREDUCE_MODELS naming a file that does not exist (a typo, or no fit yet)
    passed unseen: the job chooses by the package's figures and says so once."""
    missing = tmp_path / "modles.json"
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(missing))
    out = tmp_path / "out"
    assert main(["train", "--preset=tiny", "--no-progress", "--steps=4", f"--out={out}"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"names {missing}, which does not exist") == 1, err
    assert (out / "summary.json").exists()


@pytest.mark.parametrize(
    "argv, named",
    [
        ([], "(the compare preset's --latency 50us and a bandwidth compare chooses for this "
             "machine)"),
        (["--latency=1ms", "--bandwidth=1Gbit"], "(--latency 1ms and --bandwidth 1Gbit)"),
        (["--latency=0"], "(a bandwidth compare chooses for this machine)"),
        (["--quick"], "(the compare preset's --latency 50us and a bandwidth compare chooses "
                      "for this machine)"),
        (["--latency=2ms", "--bandwidth=unlimited"], "(--latency 2ms)"),
    ],
)  # fmt: skip
def test_compare_refuses_the_group_at_once_naming_only_what_was_given(argv, named, capsys):
    """Issue 41: `compare --allreduce twoshot` named --latency and --bandwidth the user never
    gave (the preset's, and the link compare would choose). One line, exit 2, at once."""
    assert main(["compare", "--allreduce=twoshot", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "pipesgd: error: --allreduce twoshot reduces through one host's shared memory, past "
        f"the emulated link compare trains every method over {named}; use --allreduce auto"
    ), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("latency", ["0", "0us", "0s"])
@pytest.mark.parametrize("bandwidth", ["inf", "unlimited"])
def test_compare_takes_the_group_on_plain_links_however_spelled(latency, bandwidth, capsys):
    """No emulated link, spelled any way the units take (0us, unlimited), lets the group past
    compare's link check (it compared the strings to "0" and "inf"): the refusal that follows
    is the next check's, about --width."""
    argv = ["compare", "--allreduce=twoshot", f"--latency={latency}", f"--bandwidth={bandwidth}"]
    assert main([*argv, "--width=1"]) == 2
    err = capsys.readouterr().err
    assert "--width 1 makes compare's pipe runs synchronous" in err, err
    assert "shared memory" not in err, err


def test_compare_leaves_a_bad_bandwidth_to_the_value_check(capsys):
    """A zero bandwidth is not an emulated link to name but a bad value, said as train says it."""
    assert main(["compare", "--allreduce=twoshot", "--latency=0", "--bandwidth=0"]) == 2
    err = capsys.readouterr().err
    assert "bandwidth must be > 0" in err and "shared memory" not in err, err
