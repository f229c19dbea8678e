"""The config keys in `pipesgd COMMAND --help`: every TrainConfig field, grouped, one line each
with the default the command starts from.

The keys are parsed outside argparse (parser.py `split_overrides`), so argparse alone would
never list them. Here each group is an argparse argument group whose entries are Actions that
only document: they are in the group (the help shows them) but not in the parser (parsing never
sees them), so `--key=value`, `--key value` and a yes/no key alone parse exactly as before.

CONFIG_GROUPS is the one table of the keys' help, its wording config.py's comment of each
field; a field missing from it fails tests/test_help.py, so a new field comes with its line.
"""

from __future__ import annotations

import argparse
import dataclasses

from pipesgd_ref.config import PRESETS, TrainConfig

# (group, {field: (metavar, one line)}); the metavar of a non-string field comes from its type
# (METAVARS), a yes/no field takes none (alone it means true). Each line leaves room for its
# default in a 100-column terminal.
CONFIG_GROUPS: tuple[tuple[str, dict[str, tuple[str, str]]], ...] = (
    (
        "problem keys (data, model, workers, steps)",
        {
            "dataset": ("SPEC", "digits | mnist5k | mnist:PATH | synthetic[:samples=N,...]"),
            "model": ("NAME", "softmax | mlp | cnn | resnet (cnn, resnet: images)"),
            "hidden": ("", "MLP (and CNN head) hidden widths, e.g. 128,64"),
            "channels": ("", "cnn: conv layers' channels; resnet: its 3 stages'"),
            "kernels": ("", "cnn: odd kernel size of each conv layer"),
            "depth": ("", "resnet: layers with weights, 6n + 2 (8, 14, 20, ...)"),
            "world_size": ("", "p: workers, each with its own shard of the training set"),
            "batch_size": ("", "per-worker minibatch (the effective batch: p times it)"),
            "steps": ("", "gradient computations per worker (ignored if epochs > 0)"),
            "epochs": ("", "if > 0, passes over each worker's shard instead of steps"),
            "seed": ("", "seeds the initial weights and every worker's batch order"),
        },
    ),
    (
        "optimiser keys (torch.optim.SGD's rule, lr_t's schedule)",
        {
            "lr": ("", "learning rate (lr_t's base) on the averaged gradient"),
            "lr_schedule": ("NAME", "constant | inverse | step | cosine (over the run)"),
            "lr_decay": ("", "inverse: lr_t = lr / (1 + lr_decay * t)"),
            "lr_milestones": ("", "step: lr_t = lr * lr_gamma ** (milestones <= t)"),
            "lr_gamma": ("", "step: the factor at each milestone"),
            "lr_warmup": ("", "the lr's linear warm-up over N updates (0: none)"),
            "momentum": ("", "heavy ball M in [0, 1): v = M v + d, w -= lr_t v"),
            "nesterov": ("", "Nesterov's form: w -= lr_t (d + M v) (needs momentum > 0)"),
            "weight_decay": ("", "L2: d = g + weight_decay * w"),
        },
    ),
    (
        "method keys (the algorithm, its staleness)",
        {
            "algo": ("NAME", "sync | ddp | pipe | ps-sync | ps-async"),
            "width": ("", "K: pipeline width, staleness K - 1 (2: Pipe-SGD, 1: sync)"),
            "warmup_steps": ("", "pipe: synchronous steps before the pipeline starts"),
            "compensation": ("NAME", "none | dc | dc-adaptive | predict (pipe); dc (ps-async)"),
            "dc_lambda": ("", "lambda of dc (lambda0 of dc-adaptive)"),
            "max_staleness": ("", "ps-async: hold a worker N steps ahead (-1: no bound)"),
            "bucket_size": ("BYTES", "ddp's bucket, e.g. 32KB, 1MB (0: one per layer)"),
            "ps_pulls": ("HOW", "ps-sync's pulls: sequential | shared (one link)"),
        },
    ),
    (
        "compute keys (where the model runs)",
        {
            "backend": ("NAME", "ops: numpy (the reference) | numba (njit CPU kernels)"),
            "device": ("NAME", "cpu | cuda (ring methods; a GPU or NUMBA_ENABLE_CUDASIM=1)"),
            "comm_first": ("", "compute yields the cores to communication (SCHED_IDLE)"),
        },
    ),
    (
        "communication keys (links, AllReduce, emulated network, codecs)",
        {
            "transport": ("NAME", "auto (shm on one host, tcp across) | tcp | unix | shm"),
            "allreduce": ("NAME", "auto (per message) | ring | rd | rab | oneshot | twoshot"),
            "comm": ("NAME", "sockets (the project's links) | mpi (MPI messages)"),
            "master_port": ("", "local runs: the rendezvous store's port (0: a free one)"),
            "latency": ("TIME", "emulated latency per message and link, e.g. 50us"),
            "bandwidth": ("RATE", "emulated bandwidth per link, e.g. 1Gbit"),
            "codec": ("NAME", "none | trunc16 | bf16 | q8: gradients on the ring"),
            "codec_backend": ("NAME", "codec kernels: numba (bitwise numpy's) | numpy"),
            "error_feedback": ("", "add what the codec dropped to the next gradient"),
            "codec_pull": ("NAME", "parameter server: codec of the pulled weights"),
        },
    ),
    (
        "output keys (results, evaluation, checkpoints)",
        {
            "out": ("DIR", "folder for summary.json, trace.json, checkpoint.npz"),
            "eval_every": ("", "steps between test-accuracy points (0: only at the end)"),
            "target_accuracy": ("", "test accuracy whose first crossing is reported"),
            "checkpoint_every": ("", "also checkpoint every N steps (0: only at the end)"),
            "resume": ("DIR", "a folder's checkpoint.npz to continue from"),
        },
    ),
    (
        "robustness keys (timeouts, restarts, faults)",
        {
            "timeout": ("", "seconds any wait on a peer may take before it is an error"),
            "max_restarts": ("", "whole-job restarts from the last checkpoint"),
            "skip_nonfinite": ("", "leave NaN/Inf gradients out (counted), not stop"),
        },
    ),
)
METAVARS = {"int": "N", "float": "X", "tuple[int, ...]": "LIST", "bool": None}
# a default the preset cannot tell: compare chooses its link for this machine (compare_link.py)
COMMAND_DEFAULTS = {"compare": {"bandwidth": "fit to this machine"}}
COMMAND_NOTES = {
    "compare": "With --model cnn compare starts from the compare-cnn preset, with --model "
    "resnet (and --study staleness) from compare-resnet. It runs each method itself: --algo, "
    "--codec and --codec-pull are not its to take."
}
KEYS_NOTE = (
    "Config keys go as --key VALUE or --key=VALUE (- or _ alike; a yes/no key alone means "
    "true, --key false turns it off), over --preset's values and --config's file; `pipesgd "
    "config` prints what they resolve to."
)


def option(name: str) -> str:
    """A field's option as the help writes it: world_size -> --world-size."""
    return "--" + name.replace("_", "-")


def shown_default(value) -> str:
    """A field's value as the help shows it: 128,64; none for "" or (); true; 0.1."""
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value != "" else "none"


def command_defaults(command: str, preset: str) -> dict[str, str]:
    """Each field's default as `command` starts from `preset`: the preset's value where it
    names the field, else the dataclass default (channels' empty one: "the model's")."""
    values = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    values.update(PRESETS[preset])
    shown = {name: shown_default(value) for name, value in values.items()}
    if not values["channels"]:
        shown["channels"] = "the model's"
    return {**shown, **COMMAND_DEFAULTS.get(command, {})}


def add_config_groups(sp: argparse.ArgumentParser, command: str) -> None:
    """Document every config key in `sp`'s help, one group each of CONFIG_GROUPS; a key that
    one of the command's own flags already spells (compare's --out) is left to that flag."""
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}  # annotations: str
    preset = sp.get_default("preset")
    defaults = command_defaults(command, preset)
    for title, rows in CONFIG_GROUPS:
        group = sp.add_argument_group(title)
        for name, (metavar, line) in rows.items():
            if option(name) in sp._option_string_actions:
                continue
            doc = argparse.Action(
                option_strings=[option(name)],
                dest=name,
                nargs=0 if types[name] == "bool" else None,
                default=defaults[name],
                metavar=metavar or METAVARS[types[name]],
                help=line.replace("%", "%%") + " (default %(default)s)",
            )
            group._group_actions.append(doc)  # shown in the help, never parsed
    note = f"{KEYS_NOTE} Defaults shown: the {preset} preset's. {COMMAND_NOTES.get(command, '')}"
    note = note.rstrip()
    sp.description = f"{sp.description}\n\n{note}" if sp.description else note


class CommandsFormatter(argparse.HelpFormatter):
    """The top-level help: one line per command. argparse (3.11) measures a command's name
    without the indent it prints it at, so a name longer than the others (lesson-file) ended up
    alone on its line with its help below; here the name counts at its indent."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is argparse.SUPPRESS or not hasattr(action, "_get_subactions"):
            return
        indent = self._current_indent + self._indent_increment
        for sub in action._get_subactions():
            width = len(self._format_action_invocation(sub)) + indent
            self._action_max_length = max(self._action_max_length, width)


TOP_EPILOG = (
    "`pipesgd COMMAND --help` lists a command's options: compare, train, reference and config "
    "take the config keys as well (--key VALUE), grouped by what they set."
)
