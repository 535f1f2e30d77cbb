"""UI responsiveness while training: the longest time the UI thread could not run.

Runs a short real training as a job of the studio's one engine worker (studio.worker: in this
process, on its own thread) with the Train page shown and its live plots drawing, while a QTimer
on the UI thread fires every 5 ms and records the gaps between its timeouts
(studio.train_probe.StallProbe). Prints the longest gap (the worst stall), the 99th percentile,
the longest gap per phase (loading the model, training, writing the results), the number of steps,
training tokens/s and the model's shape. Prints figures; never passes or fails.

    python bench/ui_stall.py                          # small dense + small MoE shapes
    python bench/ui_stall.py --shape qwen2.5-0.5b     # Qwen2.5-0.5B's shape (writes a ~1 GB file once)
    python bench/ui_stall.py --no-page                # the worker alone: stalls from the GIL only
    python bench/ui_stall.py --switch-ms 1            # with sys.setswitchinterval(0.001)
    python bench/ui_stall.py --demo                   # the demo's one-click run (150 steps)
    python bench/ui_stall.py --busy-core              # ... with the machine's other core kept busy
    python bench/ui_stall.py --chat 200 --shape qwen2.5-0.5b   # generating 200 tokens on the Chat page

The stall is the UI thread's own work (receiving events, redrawing one plot panel per tick, the
event log) plus the time it waits for the interpreter lock while the engine runs Python between
its NumPy calls. Training tokens/s are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import studio  # noqa: E402,F401  (first, as in the app: its OpenBLAS setting must precede NumPy)
from bench.common import SHAPES  # noqa: E402
from engine import SynthSpec, TargetSpec, write_model  # noqa: E402

SMALL = {
    "tiny-llama": SynthSpec.for_arch("llama"),
    "tiny-qwen3moe": SynthSpec.for_arch("qwen3moe"),
    "small-qwen2": SynthSpec.for_arch(
        "qwen2", V=4096, C=256, L=4, NH=4, NKV=2, HS=64, F=768, tied=True, n_ctx=1024, name="small-qwen2"
    ),
}


def shape_text(spec: SynthSpec) -> str:
    moe = f", E={spec.E} K={spec.K} F_exp={spec.F_exp}" if spec.E else f", F={spec.F}"
    return f"{spec.arch} L={spec.L} C={spec.C} NH={spec.NH}/{spec.NKV}x{spec.HS} V={spec.V}{moe} {spec.qtype}"


def write_dataset(path: Path, n: int = 32) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            user = f"Question {i}: what is {i} plus {i * 3}? Please answer briefly and explain."
            answer = (
                f"{i} plus {i * 3} is {i * 4}. Adding the two numbers gives {i * 4}, which is the answer."
            )
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": answer}]}) + "\n")  # fmt: skip


def run_events(ms: int) -> None:
    """Let the UI thread's event loop run for `ms` milliseconds (the probe keeps ticking)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def measure(
    model_path: str,
    data: str,
    steps: int,
    n_ctx: int,
    page: bool,
    preset: str,
    out: str,
    extra: dict | None = None,
) -> dict:
    """Train `steps` steps with the page (or the worker alone) and the probe running; the figures."""
    from PySide6.QtCore import QEventLoop, QTimer

    from studio.project import ModelInfo, Project
    from studio.train_probe import StallProbe

    project = Project()
    project.update(model_path=model_path, dataset_path=data, output_dir=out)
    project.update_config(
        **{
            "norms_every": 1,
            **(extra or {}),
            "steps": steps,
            "n_ctx": n_ctx,
            "targets": TargetSpec(preset=preset),
        }
    )
    loop = QEventLoop()
    probe = StallProbe(5)
    seen = {"steps": 0, "t_started": None, "t_end": None, "tokens": 0}
    t0 = time.perf_counter()
    from studio.worker import Engine

    engine = Engine()
    if page:
        from studio.pages.train.page import TrainPage

        widget = TrainPage(project, engine)
        widget.set_model_info(ModelInfo.read(model_path))
        widget.resize(1280, 820)
        widget.show()
        # the first paint of a newly shown window is not part of training: let it happen first
        run_events(500)

        def on_state(state: str) -> None:
            if state == "training":
                probe.mark("training")
                seen["t_started"] = time.perf_counter()

        def on_done(result) -> None:
            seen["steps"] = widget.last_step
            seen["tokens"] = widget.tokens_done
            seen["result"] = result
            seen["t_end"] = time.perf_counter()
            loop.quit()

        widget.sig_state_changed.connect(on_state)
        widget.sig_run_finished.connect(on_done)
        t0 = time.perf_counter()
        probe.start("loading")
        widget.start()
    else:
        from engine import Started, Step

        def on_event(e) -> None:
            if isinstance(e, Started):
                probe.mark("training")
                seen["t_started"] = time.perf_counter()
            elif isinstance(e, Step):
                seen["steps"] = e.step
                seen["tokens"] += e.tokens

        def done(result) -> None:
            seen["result"] = result
            seen["t_end"] = time.perf_counter()
            loop.quit()

        def train(session, job):
            session.new_run(data, project.config)
            return session.train(job.emit, job.should_stop)

        t0 = time.perf_counter()
        probe.start("loading")
        engine.submit("training", train, on_event=on_event, on_done=done, on_error=lambda m: done(m),
                      model=(model_path, "cpu"))  # fmt: skip
    QTimer.singleShot(30 * 60 * 1000, loop.quit)
    loop.exec()
    probe.mark("finishing")
    # let the thread end and the last redraws happen while the probe still runs
    run_events(300)
    probe.stop()
    if page:
        widget.shutdown()
        widget.close()
    engine.shutdown()
    t_train = (seen["t_end"] or time.perf_counter()) - (seen["t_started"] or t0)
    return {
        "max_ms": probe.max_gap_ms,
        "p99_ms": probe.percentile(99),
        "phases": probe.phase_max_ms(),
        "ticks": probe.n_ticks,
        "steps": seen["steps"],
        "result": type(seen.get("result")).__name__,
        "s_per_step": t_train / max(1, seen["steps"]),
        "tokens_per_s": seen["tokens"] / max(t_train, 1e-9),
        "train_s": t_train,
        "load_s": (seen["t_started"] or t0) - t0,
    }


def measure_chat(model_path: str, max_tokens: int) -> dict:
    """Send one chat message on the Chat page (the answer streamed into the conversation) with the
    probe running: the stall while the engine generates. The model is opened first (its own phase)."""
    from PySide6.QtCore import QEventLoop, QTimer

    from studio.pages.chat.page import ChatPage
    from studio.project import ModelInfo, Project
    from studio.train_probe import StallProbe
    from studio.worker import Engine

    project = Project()
    project.update(model_path=model_path)
    engine = Engine()
    page = ChatPage(project, engine)
    page.set_model_info(ModelInfo.read(model_path))
    page.sampling.max_tokens_spin.setValue(max_tokens)
    page.sampling.temp_spin.setValue(0.0)  # greedy: every run writes the same answer
    page.resize(1280, 820)
    page.show()
    loop, probe = QEventLoop(), StallProbe(5)
    seen: dict = {}
    run_events(500)  # the window's first paint is not part of generating
    probe.start("loading")
    opened = engine.submit("open", lambda session, job: None, on_done=lambda _: loop.quit(),
                           on_error=lambda m: loop.quit(), model=(model_path, "cpu"))  # fmt: skip
    loop.exec()
    if opened.error:
        raise SystemExit(f"cannot open {model_path}: {opened.error}")
    probe.mark("generating")

    def answered(reply) -> None:
        seen["reply"], seen["t_end"] = reply, time.perf_counter()
        loop.quit()

    page.sig_answered.connect(answered)
    page.sig_error.connect(lambda m: (seen.setdefault("error", m), loop.quit()))
    page.input.setPlainText("Write a long story about a lighthouse keeper and a storm.")
    t0 = time.perf_counter()
    if not page.send():
        raise SystemExit(f"the Chat page did not send: {page.status_label.text()}")
    QTimer.singleShot(30 * 60 * 1000, loop.quit)
    loop.exec()
    probe.mark("finishing")
    run_events(300)
    probe.stop()
    page.shutdown()
    page.close()
    engine.shutdown()
    if "error" in seen:
        raise SystemExit(f"generation failed: {seen['error']}")
    n = len(seen["reply"].tokens)
    t = seen["t_end"] - t0
    return {"max_ms": probe.max_gap_ms, "p99_ms": probe.percentile(99), "phases": probe.phase_max_ms(),
            "ticks": probe.n_ticks, "tokens": n, "s": t}  # fmt: skip


def report(name: str, what: str, n_ctx: int, preset: str, r: dict) -> None:
    phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
    print(
        f"{name}: {what}; n_ctx {n_ctx}, LoRA preset {preset}\n"
        f"  {r['steps']} steps ({r['result']}) in {r['train_s']:.1f} s, {r['s_per_step']:.3f} s/step, "
        f"{r['tokens_per_s']:.0f} tokens/s, "
        f"{r['load_s']:.1f} s from Start to training (model load, data)\n"
        f"  max UI stall {r['max_ms']:.1f} ms (p99 {r['p99_ms']:.1f} ms, {r['ticks']} ticks); "
        f"max by phase (ms): {phases}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help=f"one of {', '.join([*SMALL, *SHAPES])} (repeatable)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (default: 30 small, 3 large)")
    ap.add_argument("--n-ctx", type=int, default=0, help="context length (default: 128 small, 256 large)")
    ap.add_argument("--preset", default="all", help="LoRA target preset (default: all)")
    ap.add_argument("--model", help="a GGUF model to train instead of the synthetic shapes")
    ap.add_argument("--data", help="the dataset for --model (default: a generated chat set)")
    ap.add_argument("--no-page", action="store_true", help="the worker alone, without the page and plots")
    ap.add_argument(
        "--switch-ms",
        type=float,
        default=0.0,
        help="sys.setswitchinterval in ms while idle (default 5; the worker sets 0.1 while busy)",
    )
    ap.add_argument("--demo", action="store_true", help="the demo model, dataset and one-click settings")
    ap.add_argument("--chat", type=int, metavar="TOKENS", default=0,
                    help="generate TOKENS tokens on the Chat page instead of training (greedy)")  # fmt: skip
    ap.add_argument(
        "--busy-core",
        action="store_true",
        help="keep one core busy with another process (a pure-Python loop) while measuring",
    )
    ap.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "tune-studio-bench-models"),
                    help="folder for the written models (kept between runs)")  # fmt: skip
    args = ap.parse_args(argv)

    from PySide6.QtWidgets import QApplication

    from studio.app import collect_on_ui_thread

    app = QApplication.instance() or QApplication(sys.argv[:1])
    collect_on_ui_thread(app)  # as the app does: Python's GC on the UI thread
    if args.switch_ms:
        sys.setswitchinterval(args.switch_ms / 1000.0)
    shapes = args.shape or ["tiny-llama", "tiny-qwen3moe", "small-qwen2"]
    models = Path(args.models)
    models.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ui-stall-"))
    data = work / "chats.jsonl"
    write_dataset(data)
    if args.data:
        data = Path(args.data)
    print(f"switch interval {sys.getswitchinterval() * 1000:.1f} ms, page {'off' if args.no_page else 'on'}, "
          f"probe timer 5 ms, Qt platform {os.environ.get('QT_QPA_PLATFORM')}")  # fmt: skip
    hog = None
    if args.busy_core:
        import subprocess

        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print(f"another process (pid {hog.pid}) keeps one core busy", flush=True)
    try:
        if args.chat:
            return _chat(args, models)
        if args.demo:
            return _demo(args, work)
        if args.model:
            steps, n_ctx = args.steps or 30, args.n_ctx or 128
            r = measure(args.model, str(data), steps, n_ctx, not args.no_page, args.preset, str(work / "out"))
            report(os.path.basename(args.model), f"{args.model}, data {data}", n_ctx, args.preset, r)
            return 0
        return _shapes(args, models, data, work, shapes)
    finally:
        if hog is not None:
            hog.kill()


def _demo(args, work: Path) -> int:
    from studio.app import DEMO_SETTINGS
    from studio.resources import DEMO_DATASET, DEMO_MODEL

    s = dict(DEMO_SETTINGS)
    r = measure(
        str(DEMO_MODEL),
        str(DEMO_DATASET),
        args.steps or s["steps"],
        s["n_ctx"],
        not args.no_page,
        "all",
        str(work / "out"),
        extra={k: v for k, v in s.items() if k not in ("steps", "n_ctx")},
    )
    report("demo one-click run", str(DEMO_MODEL), s["n_ctx"], "all", r)
    return 0


def _chat(args, models: Path) -> int:
    from studio.resources import DEMO_MODEL

    paths = [args.model] if args.model else []
    for name in args.shape or ([] if args.model else ["demo"]):
        if name == "demo":
            paths.append(str(DEMO_MODEL))
            continue
        path = models / f"{name}.gguf"
        if not path.exists():
            write_model(path, SMALL.get(name) or SHAPES[name])
        paths.append(str(path))
    for path in paths:
        r = measure_chat(path, args.chat)
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
        print(
            f"chat on {os.path.basename(path)}: {r['tokens']} tokens in {r['s']:.1f} s "
            f"({r['tokens'] / max(r['s'], 1e-9):.1f} tokens/s, streamed into the page)\n"
            f"  max UI stall {r['max_ms']:.1f} ms (p99 {r['p99_ms']:.1f} ms, {r['ticks']} ticks); "
            f"max by phase (ms): {phases}",
            flush=True,
        )
    return 0


def _shapes(args, models: Path, data: Path, work: Path, shapes: list[str]) -> int:
    for name in shapes:
        spec = SMALL.get(name) or SHAPES[name]
        large = name in SHAPES and spec.C >= 512
        path = models / f"{name}.gguf"
        if not path.exists():
            t = time.perf_counter()
            print(f"writing {path} ...", flush=True)
            write_model(path, spec)
            print(f"  written in {time.perf_counter() - t:.1f} s", flush=True)
        steps = args.steps or (3 if large else 30)
        n_ctx = args.n_ctx or (256 if large else 128)
        r = measure(str(path), str(data), steps, n_ctx, not args.no_page, args.preset, str(work / "out"))
        report(name, shape_text(spec), n_ctx, args.preset, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
