"""GPU-less fallbacks of the host agent's GPU side, and launching with the GPUs given."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from offload_agent.device import ALIGN, CpuDevice
from offload_agent.jobs import JobRunner
from offload_agent.launcher import Gpu, gpu_inventory, launch, node_status
from shared.messages import Assignment, Job, JobEvent, NodeExit, PlacementBatch


def test_no_gpu_means_no_node_status() -> None:
    assert gpu_inventory() == []  # no NVIDIA driver on this machine
    assert node_status("n1") is None


def test_node_status_from_gpus() -> None:
    gpus = [
        Gpu(0, "NVIDIA A100-SXM4-40GB", 0.5, 10, 40, running=1),
        Gpu(1, "NVIDIA A100-SXM4-40GB", 0.0, 0, 40, running=0),
    ]
    st = node_status("n1", gpus)
    assert st is not None
    assert (st.gpu_type, st.gpus, st.free_gpus) == ("A100", 2, [1])
    assert st.gpu_util == 0.25 and st.gpu_mem_used == 10 / 80


def test_launch_sets_cuda_visible_devices() -> None:
    code = "import os, sys; sys.exit(0 if os.environ['CUDA_VISIBLE_DEVICES'] == '2,5' else 3)"
    proc = launch([sys.executable, "-c", code], [2, 5], env={"PATH": "/usr/bin"})
    assert proc.wait(30) == 0


def test_runner_starts_each_placed_job_once() -> None:
    from offload_agent.jobs import JobRunner
    from shared.messages import Assignment, Job, PlacementBatch

    calls: list[tuple[list[str], list[int], dict[str, str]]] = []

    class FakeProc:
        pid = 42

    def fake_launch(cmd, gpus, *, env):  # type: ignore[no-untyped-def]
        calls.append((cmd, list(gpus), env))
        return FakeProc()

    runner = JobRunner("n1", fake_launch, {"X": "1"})
    assert runner.learn(Job("j1", 2, 0.0, command=["train"]), 1.0) == ([], [])
    batch = PlacementBatch(1, 0.0, [Assignment("j1", "n1", [0, 1]), Assignment("j2", "n2", [0])])
    events, procs = runner.place(batch, 5.0)
    assert [(e.job_id, e.kind) for e in events] == [("j1", "started")] and len(procs) == 1
    env = {"X": "1", "RLTUNE_JOB_ID": "j1", "RLTUNE_NODE_ID": "n1", "RLTUNE_JOB_NODES": "n1"}
    assert calls == [(["train"], [0, 1], env)]
    assert runner.place(batch, 6.0) == ([], [])  # a redelivered placement starts nothing
    assert _event(runner.exited("j1", 3, 7.0)).kind == "failed"
    # placed before its accepted record arrived: waits, starts when the command is known
    early = PlacementBatch(2, 8.0, [Assignment("j3", "n1", [2])])
    assert runner.place(early, 8.0) == ([], []) and runner.waiting == {"j3": [2]}
    events, _ = runner.learn(Job("j3", 1, 0.0, command=["go"]), 9.0)
    assert [(e.job_id, e.kind) for e in events] == [("j3", "started")] and not runner.waiting
    assert calls[-1][:2] == (["go"], [2])


def test_a_job_killed_before_it_started_here_is_never_started() -> None:
    """A kill can race the job's placement: a job forbidden here (killed while not
    running here) is answered `failed` when its placement comes, takes no GPU, and is
    not answered twice; one already placed and waiting for its command is failed at
    once and its GPUs freed; a job that runs here is not affected."""
    from offload_agent.jobs import FORBIDDEN_KEPT, JobRunner
    from shared.messages import Assignment, Job, PlacementBatch

    class FakeProc:
        pid = 42

        def poll(self) -> None:
            return None

    runner = JobRunner("n1", lambda cmd, gpus, *, env: FakeProc(), gpus=4)  # type: ignore[arg-type,return-value]
    runner.learn(Job("a", 1, 0.0, command=["a"]), 0.0)
    assert runner.forbid("a", "user", 1.0) == []  # not placed here yet
    batch = PlacementBatch(1, 2.0, [Assignment("a", "n1", [0])])
    events, procs = runner.place(batch, 2.0)
    assert [(e.job_id, e.kind, e.detail) for e in events] == [
        ("a", "failed", "killed before it started (user)")
    ]
    assert procs == [] and runner.busy == {}
    assert runner.place(batch, 3.0) == ([], [])  # a redelivery: answered once
    runner.place(PlacementBatch(2, 4.0, [Assignment("b", "n1", [1, 2])]), 4.0)
    assert runner.waiting == {"b": [1, 2]} and runner.busy == {1: "b", 2: "b"}
    (ev,) = runner.forbid("b", "", 5.0)
    assert (ev.job_id, ev.kind, ev.detail) == ("b", "failed", "killed before it started")
    assert runner.waiting == {} and runner.busy == {}
    runner.learn(Job("c", 1, 0.0, command=["c"]), 0.0)
    runner.place(PlacementBatch(3, 6.0, [Assignment("c", "n1", [3])]), 6.0)
    assert runner.forbid("c", "x", 7.0) == [] and "c" not in runner.forbidden  # it runs
    for i in range(FORBIDDEN_KEPT + 5):  # memory is bounded: the newest are kept
        runner.forbid(f"z{i}", "", 8.0)
    assert len(runner.forbidden) == FORBIDDEN_KEPT and f"z{FORBIDDEN_KEPT + 4}" in runner.forbidden


def test_stats_become_prometheus_gauges() -> None:
    from prometheus_client import REGISTRY

    from offload_agent.metrics import observe
    from shared.messages import OffloadStats

    observe(OffloadStats("j9", "n9", 0.97, migration_ms_p50=2.0, bytes_in=10, step_ms=500.0))
    get = REGISTRY.get_sample_value
    assert get("rltune_offload_hit_ratio", {"job": "j9", "node": "n9"}) == 0.97
    assert get("rltune_offload_step_seconds", {"job": "j9", "node": "n9"}) == 0.5
    labels = {"job": "j9", "node": "n9", "percentile": "50"}
    assert get("rltune_offload_migration_seconds", labels) == 0.002


def test_each_job_swaps_in_its_own_directory_removed_when_it_ends(tmp_path: Path) -> None:
    from offload_agent.jobs import JobRunner
    from offload_agent.nvme import NvmeStore, job_swap_dir
    from shared.messages import Assignment, Job, PlacementBatch

    envs: dict[str, dict[str, str]] = {}

    def record_launch(cmd, gpus, *, env):  # type: ignore[no-untyped-def]
        envs[env["RLTUNE_JOB_ID"]] = env
        return subprocess.Popen([sys.executable, "-c", "pass"])

    runner = JobRunner("n1", record_launch, swap_root=tmp_path)
    ids = ["a/b", "../up", "a_b"]  # hostile and colliding-after-sanitising ids
    for i, job_id in enumerate(ids):
        runner.learn(Job(job_id, 1, 0.0, command=["x"]), 0.0)
        runner.place(PlacementBatch(i, 0.0, [Assignment(job_id, "n1", [i])]), 0.0)
    dirs = {job_id: Path(envs[job_id]["RLTUNE_SWAP_DIR"]) for job_id in ids}
    assert len(set(dirs.values())) == len(ids)  # no two jobs share a directory
    for job_id, d in dirs.items():
        assert d == job_swap_dir(tmp_path, job_id) and d.parent == tmp_path
        store = NvmeStore(d)
        store.prepare()
        store.write("w", CpuDevice().alloc_host(ALIGN), 100)
    runner.remove_swap("a/b")  # the process ended (or was killed before its own cleanup)
    assert not dirs["a/b"].exists() and dirs["a_b"].exists() and dirs["../up"].exists()


def test_swap_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from offload_agent.nvme import swap_dir

    monkeypatch.setenv("RLTUNE_SWAP_DIR", "/mnt/nvme/j1")
    assert swap_dir() == Path("/mnt/nvme/j1")
    monkeypatch.delenv("RLTUNE_SWAP_DIR")
    assert swap_dir() == Path(tempfile.gettempdir()) / "rltune-swap"


def test_a_move_is_refused_by_its_new_nodes_agent_and_the_job_runs_on() -> None:
    """The agent does not checkpoint and restart a running process: the agent of a
    move's first new node answers `rejected_placement`, starts nothing and takes no
    GPU; another node's agent says nothing; placement then keeps the job where it runs
    (its view of the running offloading jobs, and it never places the job again)."""
    from offload_agent.jobs import MOVE_REFUSED, JobRunner
    from shared.messages import Assignment, JobEvent, MoveOrder, PlacementBatch
    from tests.services.placement.test_moves import _free, _start, _state
    from tests.services.placement.test_replace import H

    calls: list[str] = []
    runner = JobRunner("b", lambda cmd, gpus, *, env: calls.append("x"), gpus=2)  # type: ignore[arg-type,return-value]
    move = MoveOrder("x", [Assignment("x", "b", [0])], 330.0, 1e4)
    events, procs = runner.place(PlacementBatch(4, 9.0, [], moves=[move]), 9.0)
    assert [(e.job_id, e.kind, e.node_ids, e.detail) for e in events] == [
        ("x", "rejected_placement", ["b"], MOVE_REFUSED)
    ]
    assert procs == [] and calls == [] and runner.busy == {}
    other = JobRunner("a", lambda cmd, gpus, *, env: None, gpus=2)  # type: ignore[arg-type,return-value]
    assert other.place(PlacementBatch(4, 9.0, [], moves=[move]), 9.0) == ([], [])

    st = _state()
    assert st.offload is not None
    zn = _start(st, st.free_round(1, 0.0, [("z", 1.0)]), 0.0)["z"]
    _start(st, st.free_round(2, 1.0, [("x", 2.0), ("y", 1.0)]), 1.0)
    st.event(JobEvent("z", "finished", 8 * H, [zn]))
    _free(st, zn)
    (mv,) = st.free_round(3, 8 * H, []).moves
    refusal = JobRunner(zn, lambda cmd, gpus, *, env: None, gpus=2)  # type: ignore[arg-type,return-value]
    (ev,), _ = refusal.place(PlacementBatch(3, 8 * H, [], moves=[mv]), 8 * H + 1)
    st.event(ev)
    assert st.offload.running[mv.job_id].start_s == 1.0  # its segment goes on where it was
    assert mv.job_id in st.gone  # running: never placed again
    assert st.free_round(4, 8 * H + 2, [(mv.job_id, 1.0)]).assignments == []
    st.event(ev)  # a redelivered refusal changes nothing
    assert mv.job_id in st.offload.running


def test_a_commands_exit_code_and_last_stderr_lines_come_back(tmp_path: Path) -> None:
    """Real processes: finished with exit code 0, failed with the code and the last five
    lines of stderr, killed by a signal with its negative number, a command that cannot
    start failed with the reason (and its GPUs freed); stdout kept in the job's log."""
    runner = JobRunner("n1", launch, {"PATH": os.environ["PATH"]}, gpus=4, logs=tmp_path / "j")
    lines = "; ".join(f"print('line {i}', file=sys.stderr)" for i in range(8))
    jobs = {
        "ok": [sys.executable, "-c", "print('to stdout')"],
        "bad": [sys.executable, "-c", f"import sys; {lines}; sys.exit(7)"],
        "sig": [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        "missing": [str(tmp_path / "nope")],
    }
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/sh\n")
    jobs["noexec"] = [str(script)]
    for i, (job_id, cmd) in enumerate(jobs.items()):
        runner.learn(Job(job_id, 1, 0.0, command=cmd), 0.0)
        events, procs = runner.place(
            PlacementBatch(i, 0.0, [Assignment(job_id, "n1", [i % 4])]), 1.0
        )
        (ev,) = events
        if job_id in ("missing", "noexec"):
            assert ev.kind == "failed" and not procs and ev.exit_code is None
            continue
        (p,) = procs
        end = _event(runner.exited(job_id, p.process.wait(30), 2.0))
        jobs[job_id] = [end.kind, end.detail, str(end.exit_code)]
    assert jobs["ok"] == ["finished", "exit code 0", "0"]
    tail = "\n".join(f"line {i}" for i in range(3, 8))
    assert jobs["bad"] == ["failed", f"exit code 7; stderr:\n{tail}", "7"]
    assert jobs["sig"] == ["failed", "exit code -15", "-15"]
    out, _ = runner.log_paths("ok")
    assert out.read_text() == "to stdout\n"
    assert runner.busy == {}  # every GPU back, the failed starts' included


def test_a_command_that_cannot_start_says_why() -> None:
    runner = JobRunner("n1", launch, {"PATH": "/usr/bin"}, gpus=2)
    runner.learn(Job("j", 1, 0.0, command=["/no/such/trainer", "--x"]), 0.0)
    (ev,), procs = runner.place(PlacementBatch(0, 0.0, [Assignment("j", "n1", [1])]), 1.0)
    assert not procs and (ev.kind, ev.node_ids) == ("failed", ["n1"])
    assert ev.detail == "cannot start '/no/such/trainer': No such file or directory"
    assert runner.busy == {}


def test_a_log_folder_that_cannot_be_written_does_not_stop_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the log folder should be
    runner = JobRunner("n1", launch, {"PATH": "/usr/bin"}, gpus=1, logs=blocker / "jobs")
    runner.learn(Job("j", 1, 0.0, command=[sys.executable, "-c", "raise SystemExit(2)"]), 0.0)
    (ev,), (p,) = runner.place(PlacementBatch(0, 0.0, [Assignment("j", "n1", [0])]), 1.0)
    assert ev.kind == "started"
    end = _event(runner.exited("j", p.process.wait(30), 2.0))
    assert (end.kind, end.detail, end.exit_code) == ("failed", "exit code 2", 2)


def test_a_failure_on_another_node_stops_the_jobs_process_here() -> None:
    class Proc:
        pid = 10**7  # no such process: the signal finds nothing, as after a quick exit

        def poll(self) -> None:
            return None

        def send_signal(self, sig: int) -> None:
            pass

    runner = JobRunner("n1", lambda cmd, gpus, *, env: Proc(), gpus=2)  # type: ignore[arg-type,return-value]
    runner.learn(Job("j", 4, 0.0, command=["x"]), 0.0)
    batch = PlacementBatch(0, 0.0, [Assignment("j", "n1", [0, 1]), Assignment("j", "n2", [0, 1])])
    runner.place(batch, 1.0)
    assert not runner.stop_sibling(JobEvent("j", "finished", 2.0, ["n2"]))  # only a failure
    assert not runner.stop_sibling(JobEvent("j", "failed", 2.0, ["n1"]))  # its own: no
    assert not runner.stop_sibling(JobEvent("other", "failed", 2.0, ["n2"]))  # not here
    assert runner.stop_sibling(JobEvent("j", "failed", 2.0, ["n2"], "exit code 3"))
    assert not runner.stop_sibling(JobEvent("j", "failed", 2.1, ["n2"]))  # once
    end = _event(runner.exited("j", -15, 3.0))
    assert (end.kind, end.detail) == (
        "failed",
        "stopped: its process on n2 failed; exit code -15 on n1",
    )
    assert runner.busy == {} and not runner.killing and not runner.stopping


def test_a_job_accepted_without_a_command_fails_when_placed_and_frees_its_gpus() -> None:
    runner = JobRunner("n1", launch, {"PATH": "/usr/bin"}, gpus=2)
    runner.learn(Job("plain", 1, 0.0), 0.0)  # (a trace's job, say: no command)
    (ev,), procs = runner.place(PlacementBatch(0, 0.0, [Assignment("plain", "n1", [1])]), 1.0)
    assert not procs and (ev.kind, ev.detail) == (
        "failed",
        "no command to run: its JobSpec has no `command`",
    )
    # placed before its accepted record: waits for it, then fails the same way
    runner.place(PlacementBatch(1, 0.0, [Assignment("late", "n1", [0])]), 2.0)
    assert runner.waiting == {"late": [0]} and runner.busy == {0: "late"}
    (ev,), procs = runner.learn(Job("late", 1, 0.0), 3.0)
    assert not procs and ev.kind == "failed" and runner.busy == {} and not runner.waiting


def test_a_job_past_its_time_limit_is_stopped_and_says_so() -> None:
    runner = JobRunner("n1", launch, {"PATH": os.environ["PATH"]}, gpus=1)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    runner.learn(Job("slow", 1, 0.0, command=sleeper, time_limit_s=0.5), 0.0)
    assert runner.limits == {"slow": 0.5}
    (ev,), (p,) = runner.place(PlacementBatch(0, 0.0, [Assignment("slow", "n1", [0])]), 1.0)
    assert ev.kind == "started"
    assert runner.time_up("slow") and not runner.time_up("slow")  # (once)
    end = _event(runner.exited("slow", p.process.wait(30), 2.0))
    assert (end.kind, end.exit_code) == ("failed", -15)
    assert end.detail == "stopped: time limit of 0.5 s reached; exit code -15"
    assert not runner.limits and not runner.stopping and runner.busy == {}
    assert not runner.time_up("slow")  # ended: nothing to stop


def test_a_processes_stats_take_their_agents_node_id_and_are_still_checked() -> None:
    import msgspec

    from offload_agent import ipc
    from shared.messages import OffloadStats

    line = ipc.encode_line(ipc.StatsMsg(OffloadStats("j", "", 0.5)))
    msg = ipc.decode(line, "n1")
    assert isinstance(msg, ipc.StatsMsg) and (msg.stats.node_id, msg.stats.hit_rate) == ("n1", 0.5)
    with pytest.raises(msgspec.ValidationError):
        ipc.decode(line)  # (no node id to give it)
    bad = ipc.encode_line(ipc.StatsMsg(OffloadStats("j", "", 7.5)))
    with pytest.raises(msgspec.ValidationError, match="hit_rate"):
        ipc.decode(bad, "n1")  # a hit rate of 7.5 is refused as on offload.stats


def test_a_preempted_job_is_reported_preempted_and_runs_again_on_a_later_round() -> None:
    runner = JobRunner("n1", launch, {"PATH": os.environ["PATH"]}, gpus=2)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    runner.learn(Job("j", 2, 0.0, command=sleeper), 0.0)
    placed = PlacementBatch(7, 0.0, [Assignment("j", "n1", [0, 1])])
    (ev,), (p,) = runner.place(placed, 1.0)
    assert ev.kind == "started"
    assert not runner.preempt("other", "x")  # not running here
    assert runner.preempt("j", "reclaim") and not runner.preempt("j", "reclaim")  # once
    end = _event(runner.exited("j", p.process.wait(30), 2.0))
    assert (end.kind, end.exit_code) == ("preempted", -15)
    assert end.detail == "preempted (reclaim); exit code -15"
    assert runner.busy == {} and not runner.preempting and not runner.killing
    # the placement that started the stopped run, delivered again, starts nothing
    assert runner.place(placed, 3.0) == ([], [])
    # a later round's placement starts it again (a new process)
    (ev,), (p2,) = runner.place(PlacementBatch(9, 0.0, [Assignment("j", "n1", [1, 0])]), 4.0)
    assert ev.kind == "started" and p2.process.pid != p.process.pid
    assert runner.kill("j", "done")
    assert _event(runner.exited("j", p2.process.wait(30), 5.0)).kind == "failed"


def _event(x: JobEvent | NodeExit) -> JobEvent:
    assert isinstance(x, JobEvent), x
    return x


class _Running:
    pid = 10**7

    def poll(self) -> None:
        return None


def _gang(nodes: list[str]) -> dict[str, JobRunner]:
    """One runner per node, each given its share of a job placed on all of them."""
    runners = {}
    batch = PlacementBatch(0, 0.0, [Assignment("g", n, [0]) for n in nodes])
    for n in nodes:
        r = JobRunner(n, lambda cmd, gpus, *, env: _Running(), gpus=1)  # type: ignore[arg-type,return-value]
        r.learn(Job("g", len(nodes), 0.0, command=["x"]), 0.0)
        (ev,), _ = r.place(batch, 1.0)
        assert ev.kind == "started"
        runners[n] = r
    return runners


@pytest.mark.parametrize(
    "order",
    [["a", "b", "c"], ["a", "c", "b"], ["b", "a", "c"], ["b", "c", "a"], ["c", "a", "b"],
     ["c", "b", "a"]],
)  # fmt: skip
def test_a_job_on_several_nodes_finishes_once_when_every_node_has_exited_0(
    order: list[str],
) -> None:
    """Each node's exit 0 is only its share (a NodeExit); read in the topic's order by
    every agent, the job's one `finished` comes from the node whose exit came last,
    and only once that record is read."""
    runners = _gang(["a", "b", "c"])
    topic = []  # jobs.exits, in publication order
    for t, n in enumerate(order):
        ex = runners[n].exited("g", 0, 10.0 + t)
        assert isinstance(ex, NodeExit) and (ex.node_id, ex.nodes) == (n, ["a", "b", "c"])
        assert runners[n].busy == {}
        topic.append(ex)
    finished = []
    for i, ex in enumerate(topic):
        for n, r in runners.items():
            ev = r.record_exit(ex)
            if ev is not None:
                finished.append((i, n, ev))
    ((i, n, ev),) = finished
    assert (i, n) == (2, order[-1])  # the last record, its own node's agent
    assert (ev.kind, ev.exit_code, ev.node_ids, ev.time) == ("finished", 0, ["a", "b", "c"], 12.0)


def test_a_job_on_several_nodes_fails_as_soon_as_one_node_fails() -> None:
    runners = _gang(["a", "b"])
    ex = runners["a"].exited("g", 0, 5.0)  # a's share is done...
    failed = runners["b"].exited("g", 3, 6.0)  # ...but b's process fails
    assert isinstance(failed, JobEvent) and isinstance(ex, NodeExit)
    assert (failed.kind, failed.exit_code, failed.node_ids) == ("failed", 3, ["b"])
    assert failed.detail.startswith("exit code 3 on b")  # names the host and the code
    assert all(r.record_exit(ex) is None for r in runners.values())  # never finished


def test_a_job_on_one_node_finishes_by_itself() -> None:
    (runner,) = _gang(["a"]).values()
    ev = _event(runner.exited("g", 0, 5.0))
    assert isinstance(ev, JobEvent) and (ev.kind, ev.detail) == ("finished", "exit code 0")
