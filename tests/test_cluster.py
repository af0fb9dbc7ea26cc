"""The Ray cluster layer on real Ray and real torch.distributed (gloo on CPU).

Ray is kept small (2 CPUs, no dashboard, 100 MB object store). Every Ray this file starts is
checked to leave no process behind: Ray processes are found by session id (the local Ray's
processes share pytest's session; each ``ray start`` subprocess gets its own), so concurrent
Ray instances of other jobs on the same machine neither hide nor fake a leak.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from rlinf_cosmos3.cluster import (
    Cluster,
    ClusterConfig,
    ClusterResources,
    NodeResources,
    PlacementError,
    Worker,
    WorkerError,
    WorkerGroup,
    plan_placement,
)
from rlinf_cosmos3.config import ConfigError, load_structured

# Ray workers (notably those of a `ray start` cluster, with another cwd) cannot import this test
# module, so its Worker subclasses travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RAY_BIN = Path(sys.executable).parent / "ray"
OBJECT_STORE_BYTES = 100 * 1024 * 1024


# --------------------------------------------------------------------------- workers under test


class Summer(Worker):
    """Records what it knew at construction; does a gloo all_reduce."""

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.rank_at_init = self.rank
        self.logger.info("constructed rank %d", self.rank)

    def all_reduce_rank(self) -> tuple[int, float, int]:
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return self.rank * self.scale, t.item(), self.rank_at_init

    def log(self, marker: str) -> None:
        self.logger.info("%s", marker)

    def fail_on(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            raise ValueError(f"boom on rank {self.rank}")
        return self.rank

    def fail_during_collective(self, bad_rank: int) -> float:
        if self.rank == bad_rank:
            raise RuntimeError(f"rank {self.rank} gave up before the all_reduce")
        t = torch.ones(1)
        dist.all_reduce(t)  # the other ranks wait here for bad_rank, which never comes
        return t.item()


class BrokenInit(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise OSError("rank 1 could not open its dataset")


# --------------------------------------------------------------------------- process bookkeeping


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running and not a zombie (a killed child can linger as one until its parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ray_processes(sid: int) -> list[str]:
    """Ray's processes (raylet, gcs_server, ray:: workers, its python daemons) in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) != sid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        cmd = _cmdline(pid)
        if cmd and _alive(pid) and any(
                tag in cmd for tag in ("raylet", "gcs_server", "ray::", "/ray/", "-m ray.", "bin/ray ")):
            found.append(f"{pid}: {cmd[:120]}")
    return found


def _wait_gone(sid: int, timeout_s: float = 30.0, exclude: frozenset[str] = frozenset()) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in _ray_processes(sid) if p.split(":")[0] not in exclude]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _wait_pids_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.3)


class RayNodeProcess:
    """A ``ray start --block`` subprocess in its own session, stopped by SIGTERM to that CLI."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        # Nodes and driver must agree on token auth. Left unset, a head turns it on when
        # ~/.ray/auth_token exists but a joining node does not, and a driver that joins by address
        # only uses it when RAY_AUTH_MODE=token was set before ray was imported -- or once a local
        # ray.init in this process (an earlier test) has set it. So follow this process's mode.
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        self.proc = subprocess.Popen([str(RAY_BIN), "start", "--block", "--disable-usage-stats", *args], env=env,
                                     stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_started(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed or timed out:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> list[str]:
        """SIGTERM the CLI (it drains and stops its node); return Ray processes left after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        left = _wait_gone(self.proc.pid)
        for entry in left:  # clean up regardless, then let the caller fail the test
            try:
                os.kill(int(entry.split(":")[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


def _head_args(port: int, num_cpus: int, temp_dir: Path) -> list[str]:
    return ["--head", "--port", str(port), "--num-cpus", str(num_cpus), "--temp-dir", str(temp_dir),
            "--include-dashboard=false", "--object-store-memory", str(OBJECT_STORE_BYTES),
            "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port())]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Ray's unix sockets live under the temp dir and their paths must stay < 108 bytes.
    path = Path(f"/tmp/rc{os.getpid()}_{time.monotonic_ns() % 10**6}")
    path.mkdir()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


# --------------------------------------------------------------------------- pure placement and config


def _nodes(*specs: tuple[float, float, dict[str, float]]) -> ClusterResources:
    return ClusterResources(tuple(
        NodeResources(node_id=f"n{i}", ip=f"10.0.0.{i}", cpus=c, gpus=g, is_head=i == 0, custom=custom)
        for i, (c, g, custom) in enumerate(specs)))


def test_plan_splits_ranks_into_node_blocks() -> None:
    plan = plan_placement(_nodes((16, 8, {}), (16, 8, {})), 16, num_nodes=2, gpus_per_rank=1, cpus_per_rank=2)
    assert [(p.node_rank, p.local_rank) for p in plan.ranks[6:10]] == [(0, 6), (0, 7), (1, 0), (1, 1)]
    assert plan.strategy == "STRICT_SPREAD" and plan.node_bundle() == {"CPU": 16.0, "GPU": 8.0}
    single = plan_placement(_nodes((2, 0, {})), 2)
    assert single.strategy == "STRICT_PACK" and single.node_bundle() == {"CPU": 2.0}


def test_gpu_request_on_cpu_cluster_names_the_fix() -> None:
    with pytest.raises(PlacementError) as err:
        plan_placement(_nodes((2, 0, {})), 8, gpus_per_rank=1)
    assert "requested 8 GPUs, cluster has 0" in str(err.value)
    assert "set cluster.num_gpus_per_node=0 / use a CPU config" in str(err.value)


def test_plan_rejects_what_no_node_can_hold() -> None:
    with pytest.raises(PlacementError, match="requested 2 nodes, cluster has 1"):
        plan_placement(_nodes((8, 0, {})), 2, num_nodes=2)
    with pytest.raises(PlacementError, match=r"must each hold 4 rank.*only 0 node"):  # 4 GPUs, but 2 + 2
        plan_placement(_nodes((8, 2, {}), (8, 2, {})), 4, gpus_per_rank=1)
    with pytest.raises(PlacementError, match=r"2 node\(s\) must each hold 3 rank.*only 1 node"):
        plan_placement(_nodes((8, 4, {}), (8, 2, {})), 6, num_nodes=2, gpus_per_rank=1)
    with pytest.raises(PlacementError, match="only 0 node"):
        plan_placement(_nodes((2, 0, {}), (2, 0, {})), 2, num_nodes=2, custom_per_rank={"slot": 1})
    with pytest.raises(PlacementError, match="cannot be split evenly"):
        plan_placement(_nodes((8, 0, {}), (8, 0, {})), 3, num_nodes=2)


def test_cluster_config_from_yaml_and_validation() -> None:
    cfg = load_structured(ClusterConfig, OmegaConf.create({"num_nodes": 2, "num_gpus_per_node": 8}), root="cluster")
    assert cfg.world_size == 16 and cfg.use_gpus
    assert ClusterConfig(num_cpu_ranks_per_node=2).world_size == 2
    with pytest.raises(ConfigError, match="cluster.num_cpus.*only applies when Ray is started locally"):
        ClusterConfig(address="auto", num_cpus=2).validate()
    with pytest.raises(ConfigError, match="object_store_memory_mb"):
        ClusterConfig(object_store_memory_mb=10).validate()


# --------------------------------------------------------------------------- a local Ray


@pytest.fixture(scope="class")
def local_cluster() -> Iterator[Cluster]:
    sid = os.getsid(0)
    before = frozenset(p.split(":")[0] for p in _ray_processes(sid))
    temp_dir = Path(f"/tmp/rc{os.getpid()}_local")
    # num_gpus=0 keeps this a CPU-only cluster on a GPU host too. Half a CPU per rank, so the
    # class-wide "summers" group and one more 2-rank group fit on 2 CPUs.
    cluster = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, object_store_memory_mb=100, temp_dir=str(temp_dir),
                                    num_cpu_ranks_per_node=2, cpus_per_rank=0.5))
    try:
        yield cluster
    finally:
        cluster.shutdown()
        left = _wait_gone(sid, exclude=before)
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)
    assert not ray.is_initialized()
    assert not left, f"Ray processes left behind after shutdown: {left}"


@pytest.fixture(scope="class")
def summers(local_cluster: Cluster) -> Iterator[WorkerGroup[Summer]]:
    with WorkerGroup.for_cluster(Summer, local_cluster, kwargs={"scale": 10}, name="summers") as group:
        yield group


class TestLocalCluster:
    def test_local_ray_reports_its_resources(self, local_cluster: Cluster) -> None:
        res = local_cluster.resources()
        assert local_cluster.owns_ray
        assert (res.num_nodes, res.total_cpus, res.total_gpus) == (1, 2, 0)

    def test_all_reduce_and_results_in_rank_order(self, summers: WorkerGroup[Summer]) -> None:
        # rank r returns r*scale; the sum of (rank+1) over 2 ranks is 3; rank known in __init__.
        assert summers.call("all_reduce_rank") == [(0, 3.0, 0), (10, 3.0, 1)]
        infos = summers.call("node_info")
        assert [(i["rank"], i["local_rank"], i["node_rank"]) for i in infos] == [(0, 0, 0), (1, 1, 0)]
        assert infos[0]["device"] == "cpu" and infos[0]["pid"] != infos[1]["pid"]
        assert summers.call_rank(1, "fail_on", bad_rank=-1) == 1

    def test_async_call_returns_object_refs(self, summers: WorkerGroup[Summer]) -> None:
        refs = summers.call_async("all_reduce_rank")
        assert all(isinstance(r, ray.ObjectRef) for r in refs)
        assert ray.get(refs) == summers.gather(refs) == [(0, 3.0, 0), (10, 3.0, 1)]
        one = summers.call_async("fail_on", -1, ranks=[1])
        assert summers.gather(one, ranks=[1]) == [1]

    def test_worker_log_lines_carry_the_rank(self, summers: WorkerGroup[Summer],
                                             capfd: pytest.CaptureFixture[str]) -> None:
        marker = f"marker-{time.monotonic_ns()}"
        summers.call("log", marker)
        seen = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(f"[summers rank {r}/2]" in seen for r in (0, 1)):
            time.sleep(0.5)
            out, err = capfd.readouterr()
            seen += "\n".join(line for line in (out + err).splitlines() if marker in line)
        assert "[summers rank 0/2]" in seen and "[summers rank 1/2]" in seen, seen

    def test_exception_reaches_driver_with_rank_and_traceback(self, summers: WorkerGroup[Summer]) -> None:
        with pytest.raises(WorkerError) as err:
            summers.call("fail_on", 1)
        assert err.value.rank == 1 and err.value.method == "fail_on"
        text = str(err.value)
        assert "summers rank 1 failed in fail_on()" in text
        assert 'File "' in text and "in fail_on" in text and "ValueError: boom on rank 1" in text
        assert summers.call("fail_on", -1) == [0, 1]  # a plain exception leaves the group usable

    def test_failure_during_collective_does_not_hang(self, local_cluster: Cluster) -> None:
        group = WorkerGroup(Summer, local_cluster, 2, args=(1,), cpus_per_rank=0.5, name="stuck")
        pids = [i["pid"] for i in group.call("node_info")]
        try:
            start = time.monotonic()
            with pytest.raises(WorkerError) as err:
                group.call("fail_during_collective", 1)
            assert err.value.rank == 1 and "gave up before the all_reduce" in str(err.value)
            assert time.monotonic() - start < 10  # rank 0 is still blocked in all_reduce
        finally:
            start = time.monotonic()
            group.shutdown()
            assert time.monotonic() - start < 5  # the stuck rank is killed, not waited for
        assert _wait_pids_gone(pids) == []

    def test_constructor_error_names_the_rank_and_frees_resources(self, local_cluster: Cluster) -> None:
        with pytest.raises(WorkerError) as err:
            WorkerGroup(BrokenInit, local_cluster, 2, cpus_per_rank=0.5, name="broken")
        assert err.value.rank == 1 and "could not open its dataset" in str(err.value)
        live = [pg["name"] for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]
        assert "broken" not in live, live  # its placement group was released

    def test_gpu_request_on_cpu_cluster_fails_before_any_actor(self, local_cluster: Cluster) -> None:
        pgs_before = len(ray.util.placement_group_table())
        start = time.monotonic()
        with pytest.raises(PlacementError, match=r"requested 8 GPUs, cluster has 0.*num_gpus_per_node=0"):
            WorkerGroup(Summer, local_cluster, 8, args=(1,), gpus_per_rank=1)
        assert time.monotonic() - start < 2
        assert len(ray.util.placement_group_table()) == pgs_before  # nothing was reserved


# --------------------------------------------------------------------------- joining running clusters


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="declares 2 GPUs that do not exist; CPU hosts only")
def test_join_existing_cluster_and_leave_it_running(short_tmp: Path) -> None:
    # The head declares 2 (nonexistent) GPUs, so the one-rank-per-GPU path runs on a CPU host:
    # Ray must give each rank its own GPU id, and with no CUDA the ranks still fall back to gloo.
    port = _free_port()
    head = RayNodeProcess([*_head_args(port, 2, short_tmp), "--num-gpus", "2"], short_tmp / "head.log")
    left: list[str] = []
    try:
        head.wait_started()
        cluster = Cluster(ClusterConfig(address=f"127.0.0.1:{port}", num_gpus_per_node=2))
        try:
            res = cluster.resources()
            assert not cluster.owns_ray and (res.total_cpus, res.total_gpus) == (2, 2)
            with WorkerGroup.for_cluster(Summer, cluster, args=(5,)) as group:
                assert group.call("all_reduce_rank") == [(0, 3.0, 0), (5, 3.0, 1)]
                infos = group.call("node_info")
                assert sorted(i["cuda_visible_devices"] for i in infos) == ["0", "1"]
                assert [i["gpu_ids"] for i in infos] == [[i["cuda_visible_devices"]] for i in infos]
                assert [i["local_rank"] for i in infos] == [0, 1]
            assert _wait_pids_gone([i["pid"] for i in infos]) == []  # the group killed its actors
        finally:
            cluster.shutdown()
        assert head.proc.poll() is None, "disconnecting must leave a joined cluster running"
        assert any("raylet" in p for p in _ray_processes(head.proc.pid))
    finally:
        left = head.stop()
    assert not left, f"Ray processes left behind: {left}"


@pytest.mark.slow
def test_two_nodes_get_one_rank_each(short_tmp: Path) -> None:
    port = _free_port()
    slot = '{"slot": 1}'
    head = RayNodeProcess([*_head_args(port, 1, short_tmp), "--resources", slot], short_tmp / "head.log")
    worker: RayNodeProcess | None = None
    left: list[str] = []
    try:
        head.wait_started()
        worker = RayNodeProcess(["--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--resources", slot,
                                 "--object-store-memory", str(OBJECT_STORE_BYTES),
                                 "--dashboard-agent-listen-port", str(_free_port())], short_tmp / "worker.log")
        worker.wait_started()
        with Cluster(ClusterConfig(address=f"127.0.0.1:{port}")) as cluster:
            deadline = time.monotonic() + 60
            while cluster.resources().num_nodes < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            res = cluster.resources()
            assert res.num_nodes == 2 and all(n.custom.get("slot") == 1 for n in res.nodes)
            with WorkerGroup(Summer, cluster, 2, args=(1,), num_nodes=2,
                             custom_resources_per_rank={"slot": 1}) as group:
                infos = group.call("node_info")
                assert infos[0]["node_id"] != infos[1]["node_id"]
                assert [i["node_id"] for i in infos] == group.node_ids
                assert [(i["node_rank"], i["local_rank"]) for i in infos] == [(0, 0), (1, 0)]
                assert group.call("all_reduce_rank") == [(0, 3.0, 0), (1, 3.0, 1)]
    finally:
        left = worker.stop() if worker is not None else []
        left += head.stop()
    assert not left, f"Ray processes left behind: {left}"


SIGTERM_DRIVER = """
import sys, time
from rlinf_cosmos3.cluster import Cluster, ClusterConfig
try:
    with Cluster(ClusterConfig(num_cpus=1, num_gpus=0, object_store_memory_mb=100, temp_dir=sys.argv[1])):
        print("ready", flush=True)
        time.sleep(300)
finally:
    time.sleep(4)  # a cleanup slower than the 3 s alarm Ray's C-level SIGTERM handler arms
    print("cleanup finished", flush=True)
"""


def test_sigterm_to_the_driver_stops_the_ray_it_started(short_tmp: Path) -> None:
    """``kill`` (or a scheduler's time limit) on a driver must not leave Ray's GCS, raylet or agents behind.

    Ray's own driver SIGTERM handler exits through ``sys.exit``, so atexit and ``with`` blocks run and the
    Cluster stops the Ray it started; this guards that path (a handler of ours must keep chaining to it).
    The driver's own cleanup takes 4 s: Ray's C-level SIGTERM handler would abort it after 3 s."""
    import psutil

    driver = subprocess.Popen([sys.executable, "-c", SIGTERM_DRIVER, str(short_tmp / "ray")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    ray_procs: list[psutil.Process] = []
    try:
        assert driver.stdout is not None
        output = []
        for line in driver.stdout:
            if line.strip() == "ready":
                break
            output.append(line)
        else:
            pytest.fail(f"the driver exited before Ray was up (rc {driver.wait()}): {''.join(output)[-2000:]}")
        ray_procs = psutil.Process(driver.pid).children(recursive=True)
        assert ray_procs, "a private Ray starts its own processes"
        driver.send_signal(signal.SIGTERM)
        rest = driver.stdout.read()
        rc = driver.wait(timeout=60)
        assert rc > 0, f"the driver died of the signal (rc {rc}) instead of exiting through its cleanup: {rest[-2000:]}"
        assert "cleanup finished" in rest, f"the driver's cleanup was cut short: {rest[-2000:]}"
        gone, alive = psutil.wait_procs(ray_procs, timeout=30)
        assert not alive, "left running after SIGTERM: " + "; ".join(
            f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running())
    finally:
        if driver.poll() is None:
            driver.kill()
        for proc in ray_procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


SIGKILL_DRIVER = """
import subprocess, sys, time
import ray
from rlinf_cosmos3.cluster import Cluster, ClusterConfig

@ray.remote(num_cpus=0)
class Idle:
    def ping(self):
        return "pong"

with Cluster(ClusterConfig(num_cpus=1, num_gpus=0, object_store_memory_mb=100, temp_dir=sys.argv[1])):
    actor = Idle.remote()
    assert ray.get(actor.ping.remote()) == "pong"
    # What servers and evaluations are: a process in a session of its own, which no signal to the
    # driver's group reaches and which nothing else would stop.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print("ready", server.pid, flush=True)
    time.sleep(300)
"""


def test_a_driver_killed_outright_leaves_no_ray_behind(short_tmp: Path) -> None:
    """SIGKILL (the out-of-memory killer, ``kill -9``) runs nothing in the driver: Ray's own processes notice,
    but a process the driver started in a session of its own (an SGLang server, an online evaluation) would
    run on, holding its GPU. The reaper the Cluster started stops everything the driver started."""
    import psutil

    from rlinf_cosmos3.cluster.reaper import DRIVER_ENV
    from rlinf_cosmos3.procgroup import processes_with_env

    driver = subprocess.Popen([sys.executable, "-c", SIGKILL_DRIVER, str(short_tmp / "ray")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)

    def started_by_driver() -> list[psutil.Process]:
        return processes_with_env(DRIVER_ENV, lambda value: value.startswith(f"{driver.pid}:"))

    procs: list[psutil.Process] = []
    try:
        assert driver.stdout is not None
        output = []
        for line in driver.stdout:
            if line.startswith("ready"):
                server = psutil.Process(int(line.split()[1]))
                break
            output.append(line)
        else:
            pytest.fail(f"the driver exited before Ray was up (rc {driver.wait()}): {''.join(output)[-2000:]}")
        procs = started_by_driver()
        assert server in procs
        names = " ".join(" ".join(p.cmdline()) for p in procs)
        assert "gcs_server" in names and "raylet" in names and "reaper" in names, names
        driver.kill()
        assert driver.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while (left := [p for p in started_by_driver()]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, "left running after the driver's SIGKILL: " + "; ".join(
            f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if p.is_running())
    finally:
        if driver.poll() is None:
            driver.kill()
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
