"""Data-parallel training over MPI on this machine: 2 and 4 ranks compute what one process does,
a rank that dies or stops ends every rank with the last checkpoint intact, ranks that differ are
refused before step 1, a checkpoint of 2 ranks resumes on 1 and one of 1 on 2, with its plan, tokens and
time (engine.train.parallel, the CLI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.model.lora import LoraAdapter
from engine.model.targets import TargetSpec
from engine.testing import SynthSpec, write_model
from engine.train import events as ev
from engine.train.checkpoint import read_checkpoint
from engine.train.collective import find_mpiexec
from engine.train.config import CONFIG_FILE, resolve_checkpoint
from engine.train.trainer import TrainConfig, Trainer
from tests.conftest import write_chats

pytest.importorskip("mpi4py", reason="the data-parallel tests need the test extra's mpi4py and MPICH")
MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (the test extra brings MPICH's)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    data = write_chats(
        d / "chats.jsonl", ((f"what is {i} plus {i}", f"{i} plus {i} is {2 * i}") for i in range(16))
    )
    return {
        "llama": write_model(d / "llama.gguf", SynthSpec.for_arch("llama", seed=11)),
        "qwen3moe": write_model(d / "moe.gguf", SynthSpec.for_arch("qwen3moe", seed=12)),
        "other": write_model(d / "other.gguf", SynthSpec.for_arch("llama", seed=12)),  # same size, other bits
        "data": data,
    }


def config(**kw) -> TrainConfig:
    base = dict(
        targets=TargetSpec(preset="all"), rank=4, alpha=8, lr=1e-2, steps=10, n_ctx=48, batch_size=4,
        grad_accum=2, val_split=0.2, eval_every=5, schedule="cosine", seed=3,
    )  # fmt: skip
    return TrainConfig(**{**base, **kw})


def env(tmp_path) -> dict:
    e = dict(os.environ)
    e["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the model-hash cache stays under tmp_path
    e["OPENBLAS_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rank_pid(pid: int, rank: int) -> int | None:
    """The process of rank `rank` among `pid`'s descendants (MPICH sets PMI_RANK in each)."""
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{p}/cmdline", "rb") as f:
                python = b"engine.cli" in f.read()
        except OSError:
            continue
        if python and f"PMI_RANK={rank}".encode() in environ:
            return p
    return None


def kill_all(proc: subprocess.Popen) -> None:
    for p in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", "train", *args]


def run(command: list[str], tmp_path, timeout: float = 90) -> subprocess.CompletedProcess:
    e = env(tmp_path)
    return subprocess.run(command, env=e, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def train_args(files, model: str, out: Path, *extra: str) -> list[str]:
    return [
        files[model], files["data"], "--out", str(out), "--preset", "all", "--rank", "4", "--alpha", "8",
        "--lr", "1e-2", "--steps", "10", "--ctx", "48", "--batch", "4", "--grad-accum", "2", "--seed", "3",
        *extra,
    ]  # fmt: skip


def single(model: str, data: str, cfg: TrainConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Losses and final parameters of one process."""
    got = []
    tr = Trainer(model, data, cfg)
    assert isinstance(tr.run(got.append), ev.Finished)
    return np.array([e.loss for e in got if isinstance(e, ev.Step)]), tr.trainable.params()


def rel_norm(a: dict, b: dict) -> float:
    num = sum(float(np.sum((np.asarray(a[k], np.float64) - b[k]) ** 2)) for k in b)
    den = sum(float(np.sum(np.asarray(b[k], np.float64) ** 2)) for k in b)
    return (num / den) ** 0.5


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_2_and_4_ranks_train_what_one_process_trains_and_every_rank_holds_it(files, tmp_path, arch):
    cfg = config()
    losses, params = single(files[arch], files["data"], cfg)
    for n in (2, 4):
        out = tmp_path / f"ranks{n}"
        out.mkdir()
        command = [MPIEXEC, "-n", str(n), sys.executable, "-m", "tests.engine.mpi_rank",
                   files[arch], files["data"], str(out), json.dumps(cfg.to_json())]  # fmt: skip
        done = run(command, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(n)]
        for r in range(1, n):  # every rank ends with the same bits
            assert ranks[r].keys() == ranks[0].keys()
            for k in ranks[0]:
                np.testing.assert_array_equal(ranks[r][k], ranks[0][k], err_msg=f"rank {r}, {k}")
        got = ranks[0]
        assert int(got["__resyncs"]) == 0  # the same bits by the all-reduce itself, not by a repair
        assert len(got["__loss"]) == 10
        assert np.max(np.abs(got["__loss"] - losses) / np.abs(losses)) <= 1e-5, (n, got["__loss"], losses)
        trained = {k: v for k, v in got.items() if not k.startswith("__")}
        assert trained.keys() == params.keys()
        assert rel_norm(trained, params) <= 1e-4, n


def test_ranks_on_the_command_line_write_the_one_process_adapter_and_resume_on_one_rank(files, tmp_path):
    """`tune-engine train --ranks 2`: rank 0 alone writes events, checkpoints and the adapter; that
    adapter is one process's; its checkpoint of step 5 resumed by one process goes on the same way, and
    so does one process's checkpoint resumed on 2 ranks (`--resume CKPT` alone)."""
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    ckpts, one_ckpts = tmp_path / "two-ckpts", tmp_path / "one-ckpts"
    extra1 = ("--events", str(tmp_path / "one.jsonl"), "--checkpoint-every", "5", "--checkpoint-dir",
              str(one_ckpts))  # fmt: skip
    run1 = run(cli(*train_args(files, "llama", one, *extra1)), tmp_path)
    assert run1.returncode == 0, run1.stderr
    extra = ("--ranks", "2", "--events", str(tmp_path / "two.jsonl"), "--checkpoint-every", "5",
             "--checkpoint-dir", str(ckpts))  # fmt: skip
    run2 = run(cli(*train_args(files, "llama", two, *extra)), tmp_path)
    assert run2.returncode == 0, run2.stderr
    assert run2.stdout.count("finished after 10 steps") == 1  # rank 0 speaks, rank 1 is quiet
    events = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "Started" and events[0]["plan"]["ranks"] == 2
    assert len(events[0]["plan"]["hosts"]) == 2
    assert sum(e["event"] == "Step" for e in events) == 10  # one writer: no step twice
    assert sorted(os.listdir(ckpts)) == ["ckpt-000005", "ckpt-000010", "run.json"]
    ref = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    ref_losses = np.array([e["loss"] for e in ref if e["event"] == "Step"])
    losses = np.array([e["loss"] for e in events if e["event"] == "Step"])
    assert np.max(np.abs(losses - ref_losses) / ref_losses) <= 1e-5
    a1, a2 = LoraAdapter.load(str(one)), LoraAdapter.load(str(two))
    pairs1 = {f"{k}.{i}": v[i] for k, v in a1.pairs.items() for i in (0, 1)}
    pairs2 = {f"{k}.{i}": v[i] for k, v in a2.pairs.items() for i in (0, 1)}
    assert rel_norm(pairs2, pairs1) <= 1e-4

    # the 2-rank checkpoint of step 5, resumed by one process: steps 6-10 as the 2 ranks took them
    got = []
    cfg = config(val_split=0.0, eval_every=0, checkpoint_dir=str(tmp_path / "resumed"))
    tr = Trainer(files["llama"], files["data"], cfg, resume=str(ckpts / "ckpt-000005"))
    assert isinstance(tr.run(got.append), ev.Finished)
    resumed = np.array([e.loss for e in got if isinstance(e, ev.Step)])
    assert [e.step for e in got if isinstance(e, ev.Step)] == list(range(6, 11))
    assert np.max(np.abs(resumed - losses[5:]) / losses[5:]) <= 1e-5
    final = {f"{k}.{i}": v[i] for k, v in tr.trainable.to_adapter("llama").pairs.items() for i in (0, 1)}
    assert rel_norm(final, pairs2) <= 1e-4

    # the one process's checkpoint of step 5 resumed on 2 ranks with no option but where to write:
    # the checkpoint's settings and plan, its tokens and time go on, the same steps as the one process
    three = tmp_path / "three.gguf"
    only = ("--out", str(three), "--ranks", "2", "--resume", str(one_ckpts / "ckpt-000005"),
            "--events", str(tmp_path / "three.jsonl"))  # fmt: skip
    resumed_run = run(cli(files["llama"], files["data"], *only), tmp_path)
    assert resumed_run.returncode == 0, resumed_run.stderr
    assert resumed_run.stderr.count("at step 5 of 10: 10 steps, context 48, batch 4") == 1  # rank 0 says it
    later = [json.loads(line) for line in (tmp_path / "three.jsonl").read_text().splitlines()]
    plan = later[0]["plan"]
    ref_steps = [e for e in ref if e["event"] == "Step"]
    assert (plan["ranks"], plan["start_step"], plan["total_steps"]) == (2, 5, 10)
    assert plan["start_tokens"] == sum(e["tokens"] for e in ref_steps[:5]) > 0
    assert plan["start_seconds"] == pytest.approx(ref_steps[4]["elapsed_s"], rel=1e-6)
    steps = [e for e in later if e["event"] == "Step"]
    assert [e["step"] for e in steps] == list(range(6, 11)) and steps[0]["elapsed_s"] > plan["start_seconds"]
    again = np.array([e["loss"] for e in steps])
    assert np.max(np.abs(again - ref_losses[5:]) / ref_losses[5:]) <= 1e-5
    meta = json.load(open(one_ckpts / "ckpt-000010" / CONFIG_FILE))  # the run's folder: its own checkpoints
    assert meta["ranks"] == 2 and meta["total_steps"] == 10
    assert meta["tokens"] == sum(e["tokens"] for e in ref_steps)
    a3 = LoraAdapter.load(str(three))
    pairs3 = {f"{k}.{i}": v[i] for k, v in a3.pairs.items() for i in (0, 1)}
    assert rel_norm(pairs3, pairs1) <= 1e-4


def test_a_different_model_file_on_one_rank_is_refused_before_step_1(files, tmp_path):
    out = tmp_path / "a.gguf"
    events = str(tmp_path / "e.jsonl")
    rank0 = ["-n", "1", *cli(*train_args(files, "llama", out, "--collective", "mpi", "--events", events))]
    rank1 = ["-n", "1", *cli(*train_args(files, "other", out, "--collective", "mpi"))]
    t0 = time.monotonic()
    done = run([MPIEXEC, *rank0, ":", *rank1], tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - t0 < 30
    assert "rank 1" in done.stderr and "does not match rank 0" in done.stderr and "model file" in done.stderr
    assert done.stderr.count("error:") == 1  # said once, by rank 0
    events = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["Failed"] and events[0]["step"] == 0
    assert not out.exists()


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_rank_that_dies_or_stops_ends_every_rank_and_keeps_the_last_checkpoint(files, tmp_path, how):
    out, ckpts, events = tmp_path / "a.gguf", tmp_path / "ckpts", tmp_path / "e.jsonl"
    extra = ("--ranks", "2", "--checkpoint-every", "2", "--checkpoint-dir", str(ckpts),
             "--events", str(events), "--rank-timeout", "3")  # fmt: skip
    args = train_args(files, "llama", out, *extra)
    args[args.index("--steps") + 1] = "100000"
    proc = subprocess.Popen(cli(*args), env=env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (ckpts.is_dir() and any(n.startswith("ckpt-") for n in os.listdir(ckpts))):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no checkpoint within 60 s"
            time.sleep(0.05)
        victim = rank_pid(proc.pid, 1)
        assert victim is not None
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        _, err = proc.communicate(timeout=30)  # every rank has ended: mpiexec has returned
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            kill_all(proc)
    assert proc.returncode != 0, err
    assert took < 30
    assert not [p for p in descendants(proc.pid)]  # no rank left behind
    if how == "stopped":  # rank 0 waited out the timeout and said so in its events and on stderr
        # the 3 s asked for, or 4x the slowest step where steps are that slow (a loaded machine)
        waited = re.search(r"waited (\d+) s for the other ranks", err)
        assert waited and int(waited.group(1)) >= 3, err
        assert json.loads(events.read_text().splitlines()[-1])["event"] == "Failed"
    last = resolve_checkpoint(str(ckpts))  # the newest complete checkpoint
    meta, params, optimizer, other = read_checkpoint(last, CONFIG_FILE)
    assert meta["step"] == int(other["trainer.step"]) >= 2 and meta["ranks"] == 2
    adapter = LoraAdapter.load(os.path.join(last, "adapter.gguf"))
    for name, (a, b) in adapter.pairs.items():
        np.testing.assert_array_equal(a, params[name + ".lora_a"])
        np.testing.assert_array_equal(b, params[name + ".lora_b"])


def test_mpi_collective_sums_broadcasts_and_gathers_like_numpy_and_never_waits_forever(tmp_path):
    """3 ranks (not a power of two): sums of several dtypes in 1 KiB buckets equal NumPy's and are
    the same bits on every rank; broadcasts and gathers of arrays and objects; a collective that
    one rank never joins ends in RankTimeout on the others after its timeout."""
    from tests.engine.mpi_ops import arrays_of

    n = 3
    t0 = time.monotonic()
    command = [MPIEXEC, "-n", str(n), sys.executable, "-m", "tests.engine.mpi_ops", str(tmp_path)]
    done = run(command, tmp_path, 60)
    assert done.returncode == 3, done.stderr[-2000:]  # a rank that timed out ended the run everywhere
    # the 1-second timeout ended it (not a 20-second one, whose message would differ); the bound only
    # says it did not wait its whole course: 3 interpreters importing NumPy on a loaded 2-core machine
    # took most of 20 s once
    assert time.monotonic() - t0 < 50
    assert "timed out after 1." in done.stdout
    got = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(n)]
    inputs = [arrays_of(r) for r in range(n)]
    for i in range(5):
        want = sum(np.asarray(x[i], np.float64) for x in inputs)
        for r in range(n):
            assert got[r][f"arr_{i}"].dtype == inputs[0][i].dtype
            np.testing.assert_allclose(got[r][f"arr_{i}"], want, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(got[r][f"arr_{i}"], got[0][f"arr_{i}"])
    for r in range(n):
        np.testing.assert_array_equal(got[r]["shared0"], np.full(4, 1, np.float32))
        np.testing.assert_array_equal(got[r]["shared1"], np.arange(3) * 2)
        assert int(got[r]["obj_from"]) == 1 and int(got[r]["obj_len"]) == 3000
        assert got[r]["gathered"].tolist() == [0, 1, 2] and got[r]["gathered_len"].tolist() == [0, 500, 1000]
        assert bool(got[r]["flag"]) and not bool(got[r]["none"])
    payload = sum(a.nbytes for a in inputs[0])
    assert int(got[0]["sent"]) == payload * 2 * (n - 1) // n  # the bandwidth-optimal all-reduce's count


def test_unit_pieces_of_the_data_parallel_step():
    from engine.train.collective import Collective, bucket_plan, resolve_kind
    from engine.train.parallel import my_rows, share

    # every row of a step goes to exactly one rank, in order, shares differing by at most one
    for n_rows in (1, 5, 8):
        for size in (1, 2, 3, 4):
            spans = [share(n_rows, r, size) for r in range(size)]
            assert spans[0][0] == 0 and spans[-1][1] == n_rows
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
            assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1

    class B:  # the rows of two micro-batches of 3 and 1 windows
        def __init__(self, n):
            self.tokens = np.zeros((n, 4))

    batches = [B(3), B(1)]
    assert my_rows(batches, 0, 2) == [(0, [0, 1])]
    assert my_rows(batches, 1, 2) == [(0, [2]), (1, [0])]
    assert my_rows(batches, 0, 5) == [] and my_rows(batches, 4, 5) == [(1, [0])]  # more ranks than rows

    f32, f64 = np.float32, np.float64
    arrays = [np.zeros(100, f32), np.zeros(300, f32), np.zeros(2, f64), np.zeros(5, f32)]
    assert bucket_plan(arrays, 1600) == [[0, 1], [2], [3]]  # one dtype per bucket, at most 1600 bytes
    assert bucket_plan(arrays, 100) == [[0], [1], [2], [3]]  # an array larger than a bucket goes alone

    one = Collective()
    assert (one.rank, one.size, one.is_root, one.parallel) == (0, 1, True, False)
    x = [np.ones(3)]
    one.allreduce(x)
    np.testing.assert_array_equal(x[0], np.ones(3))
    assert one.allgather_object("a") == ["a"] and one.any(True) and not one.any(False)
    assert resolve_kind("auto") == "single"
    with pytest.raises(Exception, match="unknown collective"):
        resolve_kind("gloo")


def test_a_single_collective_refuses_to_run_under_mpiexec(monkeypatch):
    from engine.train.collective import CollectiveError, resolve_kind

    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.raises(CollectiveError, match="one of 4 started by mpiexec"):
        resolve_kind("single")
    assert resolve_kind("auto") == "mpi"


def test_a_rank_that_drifted_is_given_rank_0s_parameters_before_anything_is_written(files, tmp_path):
    cfg = config(steps=3, val_split=0.0, eval_every=0)
    command = [MPIEXEC, "-n", "2", sys.executable, "-m", "tests.engine.mpi_rank",
               files["llama"], files["data"], str(tmp_path), json.dumps(cfg.to_json()), "drift"]  # fmt: skip
    done = run(command, tmp_path, 60)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2))
    assert int(r0["__resyncs"]) == int(r1["__resyncs"]) == 1
    for k in r0:
        if not k.startswith("__"):
            np.testing.assert_array_equal(r1[k], r0[k], err_msg=k)


def test_ranks_without_an_mpi_launcher_is_a_one_line_error(files, tmp_path, monkeypatch, capsys):
    import engine.cli.ranks as ranks_module
    from engine.cli.main import main

    monkeypatch.setattr(ranks_module, "find_mpiexec", lambda: None)
    code = main(["train", *train_args(files, "llama", tmp_path / "a.gguf", "--ranks", "2")])
    err = capsys.readouterr().err
    assert code == 2 and "--ranks needs MPI's launcher (mpiexec): pip install 'tune-studio[mpi]'" in err
    assert main(["train", *train_args(files, "llama", tmp_path / "a.gguf", "--ranks", "0")]) == 2
    assert "--ranks must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "a.gguf").exists()


def test_a_preference_run_is_refused_on_several_ranks(files, tmp_path, capsys):
    """DPO and ORPO compare the two answers of each pair, which the ranks' shares of a step would
    split: `--ranks` with a preference objective is a one-line error before any process starts, and
    ranks started by mpiexec refuse it before step 1, said once, writing nothing."""
    from engine.cli.main import main

    pairs = tmp_path / "prefs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"say {i}", "chosen": f"yes {i}", "rejected": f"no {i}"})
                             + "\n" for i in range(8)))  # fmt: skip
    out = tmp_path / "a.gguf"
    args = [
        files["llama"],
        str(pairs),
        "--out",
        str(out),
        "--steps",
        "2",
        "--ctx",
        "48",
        "--objective",
        "dpo",
    ]
    assert main(["train", *args, "--ranks", "2"]) == 2
    assert "--objective dpo trains in one process" in capsys.readouterr().err
    done = run([MPIEXEC, "-n", "2", *cli(*args, "--collective", "mpi")], tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "DPO trains in one process" in done.stderr and done.stderr.count("error:") == 1
    assert not out.exists()
