"""`tune-engine train`: fine-tune with LoRA (and full-weight tensors) on a JSONL dataset.

Its options, how they become a `TrainConfig` (an option not given takes the checkpoint's value when
a run is resumed, and a resumed run refuses changed settings unless --accept-changes), and the run
itself with its progress lines, its events log and its ranks. Registered by `engine.cli.main`; the
runtime options and the session are `engine.cli.common`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..io.files import AppendLog
from ..model.summary import human_bytes
from . import ranks
from .common import CliError, add_runtime_options, open_session, read_text


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


# train options -> (TrainConfig field, the value when the option is not given and no checkpoint is
# resumed); with --resume, an option not given takes the checkpoint's value instead
TRAIN_OPTIONS: dict[str, tuple[str, object]] = {
    "rank": ("rank", 16), "alpha": ("alpha", None), "lr": ("lr", 2e-4), "schedule": ("schedule", "cosine"),
    "warmup": ("warmup_steps", 0), "weight_decay": ("weight_decay", 0.0), "gclip": ("gclip", 0.0),
    "max_grad_norm": ("max_grad_norm", 1.0), "epochs": ("epochs", 1.0), "steps": ("steps", 0),
    "ctx": ("n_ctx", 512), "batch": ("batch_size", 1), "grad_accum": ("grad_accum", 1),
    "val_split": ("val_split", 0.0), "eval_every": ("eval_every", 0),
    "train_on_prompt": ("train_on_prompt", False), "skip_unreached": ("skip_unreached_experts", False),
    "router_aux_coef": ("router_aux_coef", 0.0),
    "reward_mode": ("reward_mode", "none"), "kl": ("kl_coef", 0.0), "seed": ("seed", 0),
    "objective": ("objective", "sft"), "beta": ("dpo_beta", 0.1), "orpo_lambda": ("orpo_lambda", 0.1),
    "checkpoint_layers": ("checkpoint_layers", "auto"), "checkpoint_every": ("checkpoint_every", 0),
    "out_type": ("out_type", "F32"),
}  # fmt: skip


def _given_settings(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the command line sets itself (options not given are None)."""
    from ..model.targets import TargetSpec

    given = {}
    for option, (name, _default) in TRAIN_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            given[name] = value
    if "epochs" in given:
        given["steps"] = 0  # epochs given: the step total follows them
    if args.preset or args.targets or args.layers:
        given["targets"] = TargetSpec(
            preset=args.preset or ("none" if args.targets else "attention"),
            patterns=tuple(p for p in (args.targets or "").split(",") if p),
            layers=args.layers,
        )
    if args.full is not None:
        given["full"] = tuple(p for p in args.full.split(",") if p)
    if "rank" in given and "alpha" not in given:
        given["alpha"] = 2.0 * given["rank"]
    return given


def _resume_changes(args: argparse.Namespace, info, config) -> list[str]:
    """What differs from the checkpoint's run in a way that changes its trajectory: settings, the
    dataset, the model."""
    from ..train.resume import trajectory_changes

    changes = trajectory_changes(info.config, config)
    if not info.knows_data:
        print(f"note: {info.path} does not record its dataset; continuing on {args.data}", file=sys.stderr)
    elif not info.same_data(args.data):
        changes.append(f"dataset {info.describe_data()} -> {args.data} (other samples)")
    if info.model and not _same_path(info.model, args.model):
        changes.append(f"model {info.model} -> {args.model}")
    return changes


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def train_config(args: argparse.Namespace):
    """The TrainConfig of `tune-engine train`'s arguments and the checkpoint it resumes (None: a new
    run): the options given, over the checkpoint's settings or the defaults, or the --settings file's
    (CliError or ConfigError naming a bad value; nothing is written)."""
    from dataclasses import replace

    from ..train.resume import read_checkpoint_info
    from ..train.trainer import TrainConfig

    if args.epochs is not None and args.steps is not None:
        raise CliError("give --epochs or --steps, not both")
    out = args.out
    given = _given_settings(args)
    info = read_checkpoint_info(args.resume) if args.resume else None
    if info is None:
        defaults = {name: default for name, default in TRAIN_OPTIONS.values() if default is not None}
        base = TrainConfig(**{**defaults, "alpha": 2.0 * given.get("rank", 16)})
    else:
        base = info.config  # the checkpoint's run: its settings, unless an option changes them
    config = replace(base, **given, device=args.device, cache_budget=args.cache_budget, out=out)
    if args.sample_prompts:  # sample answers every --sample-every steps (engine.train.samples)
        prompts = tuple(p for p in read_text(args.sample_prompts).splitlines() if p.strip())
        config = replace(config, sample_prompts=prompts, sample_every=args.sample_every or 10)
    if args.sample_from_validation:  # and the prompts of the first N validation samples
        if not config.val_split:
            raise CliError(
                "--sample-from-validation answers prompts of the validation split, and there is none: "
                "give --val-split (e.g. 0.1), or type the prompts in a file for --sample-prompts"
            )
        config = replace(
            config,
            sample_from_validation=args.sample_from_validation,
            sample_every=args.sample_every or config.sample_every or 10,
        )
    ckpt_dir = args.checkpoint_dir or (
        info.run_dir if info is not None
        else os.path.splitext(out)[0] + ".checkpoints" if config.checkpoint_every else None
    )  # fmt: skip
    config = replace(config, checkpoint_dir=ckpt_dir)
    if args.settings:  # the file's settings replace the options; a resumed run keeps its checkpoint folder
        folder = ckpt_dir if info is not None else args.checkpoint_dir
        config = ranks.settings_config(args.settings, config, folder, CliError)
    return config, info


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import events as ev
    from ..train.advice import plan_warning
    from ..train.resume import describe_settings

    if args.ranks < 1:
        raise CliError(f"--ranks must be at least 1, got {args.ranks}")
    if args.ranks > 1 and args.objective not in (None, "sft"):
        raise CliError(
            f"--objective {args.objective} trains in one process (its loss compares the two answers of "
            "each pair, which cannot be split across processes): leave out --ranks"
        )
    if ranks.several_ranks_wanted(args):
        return ranks.launch_local(args.ranks, args.argv, CliError)
    comm = args.comm = ranks.open_ranks(args)
    root = comm.is_root  # with several ranks, rank 0 alone prints progress and writes events
    config, info = train_config(args)
    if info is not None:
        changes = _resume_changes(args, info, config)
        if changes and not args.accept_changes:
            raise CliError(
                f"{info.path} is step {info.step} of a run with other settings; resuming with these would "
                f"change its trajectory: {'; '.join(changes)}. Leave those options out to continue the run "
                "as it was, or add --accept-changes to continue with them"
            )
        planned = f" of {info.total_steps}" if info.total_steps else ""
        if root:
            print(f"resuming {info.path} at step {info.step}{planned}: {describe_settings(config)}"
                  + (f" (changed: {'; '.join(changes)})" if changes else ""), file=sys.stderr)  # fmt: skip
    tty = sys.stderr.isatty()
    # appended to, never truncated: a resumed run's events follow the first part's; each event is
    # flushed at once and synced to disk every second, at each checkpoint and at the end
    events_log = AppendLog(args.events) if args.events and root else None
    stop = {"requested": False}
    run_steps = {"total": 1}  # the run's step total, for the preference lines between step lines

    def log_event(e) -> None:
        nonlocal events_log
        try:
            events_log.write((ev.event_to_json(e) + "\n").encode("utf-8"))
            if isinstance(e, (ev.Checkpoint, ev.Finished, ev.Failed)):
                events_log.sync()
        except OSError as exc:  # the run goes on: its checkpoints and adapter matter more
            print(f"{chr(10) if tty else ''}warning: {args.events}: events are no longer written "
                  f"({exc.strerror or exc})", file=sys.stderr)  # fmt: skip
            with contextlib.suppress(OSError):
                events_log.close()
            events_log = None

    def on_event(e) -> None:
        if not root:
            return
        if events_log is not None:
            log_event(e)
        if isinstance(e, ev.Started):
            p = e.plan
            m = p.memory_bytes
            start = f", from step {p.start_step}" if p.start_step else ""
            print(f"training {len(p.lora_targets)} LoRA targets + {len(p.full_tensors)} full tensors "
                  f"({p.trainable_params:,} parameters) on {p.n_train} samples ({p.n_val} validation), "
                  f"{p.total_steps} steps{start}; memory estimate {human_bytes(m['total'])} at peak "
                  f"(model file {human_bytes(m['stored'])}, weight cache {human_bytes(m['cache'])}, "
                  f"layer checkpointing {'on' if m['checkpoint'] else 'off'})", file=sys.stderr)  # fmt: skip
            weak = plan_warning(p.total_steps, config.lr)  # the whole run's plan, resumed or not
            if weak:
                print(f"warning: {weak}", file=sys.stderr)
            for problem in p.problems[:20]:
                print(f"  {problem}", file=sys.stderr)
            total = max(p.problems_total, len(p.problems))  # the plan lists the first 1000
            if total > 20:
                print(f"  ... and {total - 20} more problems", file=sys.stderr)
        elif isinstance(e, ev.Step):
            run_steps["total"] = e.total_steps
            line = (f"step {e.step}/{e.total_steps}  loss {e.mean_ce:.4f}  lr {e.lr:.2e}  "
                    f"grad {e.grad_norm:.3f}  {e.tokens_per_s:.0f} tok/s  elapsed {_fmt_time(e.elapsed_s)}  "
                    f"eta {_fmt_time(e.eta_s)}")  # fmt: skip
            if tty:
                width = 24
                done = int(width * e.step / e.total_steps)
                print(f"\r[{'#' * done}{'.' * (width - done)}] {line}", end="", file=sys.stderr, flush=True)
            elif e.step == e.total_steps or e.step % max(1, e.total_steps // 20) == 0 or e.step == 1:
                print(line, file=sys.stderr)
        elif isinstance(e, ev.PreferenceStep) and not tty:
            if e.step == 1 or e.step % max(1, run_steps["total"] // 20) == 0:
                print(f"  pairs: accuracy {e.accuracy:.3f}  margin {e.margin:+.4f}  log p chosen "
                      f"{e.chosen_logp:.3f} rejected {e.rejected_logp:.3f}", file=sys.stderr)  # fmt: skip
        elif isinstance(e, ev.PreferenceEval):
            print(f"{chr(10) if tty else ''}held-out pairs at step {e.step}: accuracy {e.accuracy:.3f}, "
                  f"margin {e.margin:+.4f}, {e.objective} loss {e.loss:.4f} ({e.n_pairs} pairs)",
                  file=sys.stderr)  # fmt: skip
        elif isinstance(e, ev.Eval):
            print(f"{chr(10) if tty else ''}eval at step {e.step}: loss {e.mean_ce:.4f} "
                  f"(perplexity {e.perplexity:.2f}, {e.n_tokens} tokens)", file=sys.stderr)  # fmt: skip
        elif isinstance(e, ev.Checkpoint):
            print(f"{chr(10) if tty else ''}checkpoint: {e.path}", file=sys.stderr)
        elif isinstance(e, ev.RunWarning):
            print(f"{chr(10) if tty else ''}warning at step {e.step}: {e.message}", file=sys.stderr)
        elif isinstance(e, ev.SampleAnswers):
            for prompt, answer in zip(e.prompts, e.answers, strict=True):
                print(
                    f"{chr(10) if tty else ''}sample at step {e.step}: {prompt!r} -> {answer!r}",
                    file=sys.stderr,
                )

    import signal

    def on_sigint(signum, frame) -> None:
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        if root:
            print("\nstopping after this step (Ctrl-C again to abort)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        session = open_session(args)
        run = session.new_run(
            args.data, config, resume=args.resume, init_adapter=args.init_adapter, collective=comm
        )
        result = session.train(on_event, lambda: stop["requested"])
    finally:
        signal.signal(signal.SIGINT, previous)
        if events_log is not None:
            with contextlib.suppress(OSError):
                events_log.close()
    if tty and root:
        print(file=sys.stderr)
    if isinstance(result, ev.Failed):
        # every rank failed the same way (they agree before step 1 and on every step), unless another
        # rank stopped answering: then main() ends them all
        args.ranks_agree = not run.rank_lost
        raise CliError(result.message)
    if not root:
        return 0
    what = "stopped" if result.stopped else "finished"
    loss = f", loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    print(f"{what} after {result.step} steps{loss}")
    for label, path in (("adapter", result.adapter_path), ("model", result.merged_path),
                        ("checkpoint", result.checkpoint_path)):  # fmt: skip
        if path:
            print(f"{label}: {path}")
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("train", help="fine-tune with LoRA (and/or full-weight tensors) on a JSONL dataset")
    s.add_argument("model")
    s.add_argument("data", help="JSONL: messages, prompt/response or text samples, optional reward")
    s.add_argument(
        "--out", required=True, help="adapter GGUF to write (runs with --full also write OUT.model.gguf)"
    )
    s.add_argument(
        "--out-type", default=None, choices=("F32", "F16", "Q8_0"), help="adapter tensor type (F32)"
    )
    s.add_argument(
        "--preset",
        choices=("attention", "mlp", "experts", "router", "all", "none"),
        help="LoRA target preset (default attention)",
    )
    s.add_argument(
        "--targets", help="extra LoRA targets: comma-separated names, globs or kinds (output, attn_q, ...)"
    )
    s.add_argument("--layers", help="layer range of the targets, e.g. 0-11 or 0,2,4")
    s.add_argument("--rank", type=int, default=None, help="LoRA rank (default 16)")
    s.add_argument("--alpha", type=float, help="LoRA alpha (default 2 x rank)")
    s.add_argument("--full", help="tensors trained in full: comma-separated names/globs/kinds, or 'all'")
    s.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-4)")
    s.add_argument(
        "--schedule", default=None, choices=("constant", "linear", "cosine"), help="default cosine"
    )
    s.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 0)")
    s.add_argument("--weight-decay", type=float, default=None, help="decoupled weight decay (default 0)")
    s.add_argument("--gclip", type=float, default=None, help="element-wise gradient clipping; 0 = off")
    s.add_argument("--max-grad-norm", type=float, default=None, help="global gradient-norm clipping; 0 = off")
    s.add_argument("--epochs", type=float, help="passes over the data (default 1)")
    s.add_argument("--steps", type=int, help="optimizer steps (instead of --epochs)")
    s.add_argument("--ctx", type=int, default=None, help="packed window length in tokens (default 512)")
    s.add_argument("--batch", type=int, default=None, help="windows per micro-batch (default 1)")
    s.add_argument("--grad-accum", type=int, default=None, help="micro-batches per step (default 1)")
    s.add_argument(
        "--val-split", type=float, default=None, help="fraction held out for validation (default 0)"
    )
    s.add_argument(
        "--eval-every", type=int, default=None, help="steps between validation passes; 0 = at the end"
    )
    s.add_argument("--sample-prompts", help="prompts, one a line, answered (greedy) during training")
    s.add_argument(
        "--sample-from-validation", type=int, default=0, metavar="N",
        help="also answer the prompts of the first N validation samples (file order; needs --val-split)",
    )  # fmt: skip
    s.add_argument("--sample-every", type=int, default=None, help="steps between sample answers (default 10)")
    s.add_argument("--train-on-prompt", action="store_true", default=None, help="loss on prompt tokens too")
    s.add_argument(
        "--router-aux-coef",
        type=float,
        default=None,
        help="MoE, router trained (ffn_gate_inp in the targets or --full): weight of the Switch Transformer "
        "load-balancing loss of each MoE layer, summed over the layers (default 0: off)",
    )
    s.add_argument(
        "--skip-unreached",
        action="store_true",
        default=None,
        help="MoE: leave out (freeze) the LoRA factors of the experts no token of the data reaches (the "
        "routing census of `tune-engine census`)",
    )
    s.add_argument(
        "--reward-mode",
        default=None,
        choices=("none", "weighted", "group"),
        help="use sample rewards: reward-weighted SFT or group-relative (default none)",
    )
    s.add_argument(
        "--kl", type=float, default=None, help="group mode: KL penalty to the base model (default 0)"
    )
    s.add_argument(
        "--objective",
        default=None,
        choices=("sft", "dpo", "orpo"),
        help="sft: learn the answers; dpo / orpo: learn from preference pairs (prompt, chosen, rejected); "
        "DPO's reference is the model with the adapter off (default sft)",
    )
    s.add_argument("--beta", type=float, default=None, help="DPO beta (default 0.1)")
    s.add_argument("--orpo-lambda", type=float, default=None, help="ORPO lambda (default 0.1)")
    s.add_argument(
        "--checkpoint-layers",
        nargs="?",
        const="on",
        default=None,
        choices=("auto", "on", "off"),
        help="recompute layers in the backward pass (less memory); default auto: on when the memory "
        "estimate says activations would not fit",
    )
    s.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    s.add_argument("--checkpoint-dir", help="checkpoint folder (default OUT.checkpoints)")
    s.add_argument(
        "--resume",
        help="checkpoint folder to continue from (ckpt-NNNNNN, or a folder of them: the newest); the run "
        "continues with the checkpoint's own settings, to its planned step",
    )
    s.add_argument(
        "--accept-changes",
        action="store_true",
        help="with --resume: continue with options (or a dataset, or a model) that differ from the "
        "checkpoint's run, although that changes its trajectory",
    )
    s.add_argument("--init-adapter", help="adapter GGUF to continue training")
    s.add_argument("--template-file", help="Jinja chat template overriding the model's")
    s.add_argument("--seed", type=int, default=None, help="shuffling, split and LoRA init (default 0)")
    s.add_argument(
        "--events", help="append every event as one JSON line to this file (an events log; never truncated)"
    )
    s.add_argument(
        "--settings",
        help="a run's settings as JSON (what the studio writes: every TrainConfig field); they replace "
        "the training options above, while --out, --checkpoint-dir, --device and --cache-budget still apply",
    )
    add_runtime_options(s)
    ranks.add_options(s)
    s.set_defaults(func=cmd_train)
