"""A throw-away standalone Spark cluster whose workers share no local disk, for tests.

:class:`StandaloneCluster` starts one master and N workers with PySpark's own
launcher, ``bin/spark-class`` of the installed package (its Spark home), each
in the foreground as a process of its own, and stops them all when the
``with`` block ends.

Why namespaces and addresses
----------------------------

On a real cluster each worker is a machine: its own ``/tmp``, its own local
directories, its own address. Two workers started plainly on one machine share
all three, and Spark notices: an executor reads the shuffle files of another
executor on the *same host* straight from disk (``spark.shuffle.readHostLocalDisk``),
so a test of two such workers passes or fails for reasons no real cluster
has. So each daemon (the master too) runs under

    unshare --mount --propagation private --pid --fork --kill-child --mount-proc \\
        sh -c 'mount -t tmpfs tmpfs /tmp && exec spark-class CLASS ARGS...'

* **its own mount namespace with a private** ``/tmp``: a fresh tmpfs over
  ``/tmp`` that no other process sees (with the Python, PySpark and
  tickwheel installation bound back in when it lives under ``/tmp``, as a
  checkout there does: :data:`PRIVATE_TMP`). The worker's directory
  (``SPARK_WORKER_DIR``: its executors' logs and working directories) and
  its local directories (``SPARK_LOCAL_DIRS``: shuffle and spill files) are
  in it, so a worker's local files are its own, and they vanish with it;
* **its own PID namespace**, whose first process (PID 1) is the daemon's JVM:
  when it dies, the kernel kills everything else in the namespace, the
  worker's executor JVMs and their Python workers included (PySpark's daemon
  puts those in a process group of their own). Where /proc cannot be
  mounted again (some containers), the daemon gets the mount namespace
  alone; killing a daemon (:meth:`Daemon.kill`) then kills its process group
  and every process of its mount namespace, which comes to the same. Either
  way, killing a worker (:meth:`StandaloneCluster.kill_worker`) is a machine
  going away, and nothing outlives the cluster;
* **its own loopback address**: Linux routes all of ``127.0.0.0/8`` to the
  loopback device, so the master binds ``127.0.0.1``
  (:data:`MASTER_HOST`), worker 1 ``127.0.0.2`` and worker 2 ``127.0.0.3``
  (:data:`WORKER_HOSTS`): ``--host`` and ``SPARK_LOCAL_IP`` of that process,
  which its executors inherit (they bind and advertise it). The network
  namespace stays the machine's, so the driver (a process outside all the
  namespaces, on ``127.0.0.1``) reaches every daemon and executor, and they
  reach it.

Data a job reads and writes must then be in a directory every process sees,
outside ``/tmp``: see :func:`shared_directory`. The daemons' own logs (their
standard output and error) go to that directory too, ``SPARK_PID_DIR``,
``SPARK_LOG_DIR`` and ``SPARK_CONF_DIR`` point into it, and every process
starts there: nothing is written into the repository or the caller's working
directory. The executors' logs are in a worker's private ``/tmp``: the cluster
reads them through ``/proc/PID/root``, the namespace's own view of the file
system (:meth:`StandaloneCluster.executor_logs`).

Needs root (or the capabilities to make a mount namespace and mount a tmpfs):
:func:`namespaces_unavailable` says why not when it cannot.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LOCAL_DIRS",
    "MASTER_HOST",
    "WORKER_DIR",
    "WORKER_HOSTS",
    "ClusterError",
    "Daemon",
    "StandaloneCluster",
    "free_port",
    "group_members",
    "kill_all",
    "namespaces_unavailable",
    "shared_directory",
    "spark_home",
    "unshare_command",
]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MASTER_HOST = "127.0.0.1"
#: Worker ``i``'s address is ``WORKER_HOSTS[i]``.
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")

#: The namespaces each daemon runs in (see the module's docstring), best first:
#: with a PID namespace of its own, then, where /proc cannot be mounted again
#: (some containers), a mount namespace alone. ``--kill-child``: should
#: ``unshare`` itself die, its child (the namespace's PID 1) dies with it.
UNSHARE_VARIANTS = (
    ["unshare", "--mount", "--propagation", "private",
     "--pid", "--fork", "--kill-child", "--mount-proc"],
    ["unshare", "--mount", "--propagation", "private"],
)  # fmt: skip
#: Run in the new namespaces: a private tmpfs over /tmp, then the daemon itself. The
#: directories named in ``$KEEP_IN_TMP`` (this Python, PySpark and tickwheel when they
#: are installed under /tmp: a checkout there) are bound back into it from the /tmp
#: below, which the shell still reaches through its working directory (hence
#: ``--no-canonicalize``: ``mount`` would otherwise resolve ``./d`` to ``/tmp/d`` in the
#: new tmpfs): the same software at the same path, as a cluster's machines each have it.
PRIVATE_TMP = (
    'start="$PWD" && cd /tmp && mount -t tmpfs -o size={size} tmpfs /tmp'
    ' && for d in $KEEP_IN_TMP; do mkdir -p "/tmp/$d"'
    ' && mount --no-canonicalize --bind "./$d" "/tmp/$d"; done'
    ' && cd "$start" && exec "$@"'
)


def kept_in_tmp() -> str:
    """The top directories under /tmp that hold this Python, PySpark or tickwheel."""
    import tickwheel

    places = (sys.prefix, sys.base_prefix, sys.executable, spark_home(), tickwheel.__file__)
    names = set()
    for place in places:
        parts = Path(os.path.realpath(place)).parts
        if len(parts) > 2 and parts[:2] == ("/", "tmp"):
            names.add(parts[2])
    return " ".join(sorted(names))


#: Where a worker keeps its executors' directories and its local (shuffle) files:
#: inside its private /tmp.
WORKER_DIR = "/tmp/spark-worker"
LOCAL_DIRS = "/tmp/spark-local"

#: Where :func:`shared_directory` makes its directories: a disk every process
#: sees, not /tmp (private to each daemon).
SHARED_PARENT = "/var/tmp"


class ClusterError(RuntimeError):
    """The cluster did not start or did not answer in time."""


def spark_home() -> Path:
    """The installed PySpark package: a complete Spark home (``bin/spark-class``, jars)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def namespaces_unavailable(timeout: float = 20.0) -> str | None:
    """Why this machine cannot run :class:`StandaloneCluster`, or None when it can.

    Tries what each daemon does (the namespaces, a tmpfs over /tmp) with a
    shell, and checks that the daemons' addresses bind.
    """
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java (java on PATH or JAVA_HOME)"
    if not (spark_home() / "bin" / "spark-class").is_file():
        return f"{spark_home()}/bin/spark-class is missing"
    try:
        unshare_command(timeout)
    except ClusterError as exc:
        return str(exc)
    for host in (MASTER_HOST, *WORKER_HOSTS):
        try:
            free_port(host)
        except OSError as exc:
            return f"cannot bind the loopback address {host}: {exc}"
    return None


@functools.cache
def unshare_command(timeout: float = 20.0) -> tuple[str, ...]:
    """The first of :data:`UNSHARE_VARIANTS` that makes its namespaces and mounts a
    private /tmp here (found once per process); ClusterError saying why none does."""
    failures = []
    for variant in UNSHARE_VARIANTS:
        probe = [*variant, "sh", "-c", PRIVATE_TMP.format(size="1m"), "sh", "true"]
        env = {**os.environ, "KEEP_IN_TMP": kept_in_tmp()}
        try:
            done = subprocess.run(
                probe, capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
                env=env,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{' '.join(variant)}: {exc}")
            continue
        if done.returncode == 0:
            return tuple(variant)
        why = done.stderr.strip() or f"exit status {done.returncode}"
        failures.append(f"{' '.join(variant)}: {why}")
    raise ClusterError(
        "cannot make a mount namespace with a private /tmp (needs root): " + "; ".join(failures)
    )


def free_port(host: str = MASTER_HOST) -> int:
    """A port of ``host`` free a moment ago."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _processes() -> list[tuple[int, int, str | None]]:
    """(pid, process group, mount namespace) of every live process, from /proc: zombies
    (dead, waiting for their parent to reap them) left out."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
            namespace = os.readlink(f"/proc/{entry}/ns/mnt")
        except OSError:
            continue  # gone meanwhile
        if fields[0] not in ("Z", "X"):
            found.append((int(entry), int(fields[2]), namespace))
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    return [pid for pid, group, _ in _processes() if group == pgid]


def kill_all(pgid: int, namespace: str | None = None, timeout: float = 30.0) -> None:
    """SIGKILL process group ``pgid`` and every process of mount namespace ``namespace``
    (``mnt:[inode]``; a process may leave its group), until none is left. O(processes)
    per round; ClusterError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, group, ns in _processes() if group == pgid or ns == namespace]
        if not left:
            return
        if time.monotonic() > deadline:  # pragma: no cover - the kernel's job
            raise ClusterError(f"processes {left} outlived SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@contextlib.contextmanager
def shared_directory(prefix: str = "tickwheel-cluster-") -> Iterator[Path]:
    """A new directory every process of the cluster sees (under :data:`SHARED_PARENT`,
    not /tmp), removed with its contents at the end."""
    path = Path(SHARED_PARENT) / f"{prefix}{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Daemon:
    """One master or worker: ``unshare`` (the leader of its own process group), the
    namespaces it made, and the JVM inside them."""

    name: str
    host: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def root(self) -> Path:
        """The daemon's file system as its mount namespace sees it (its private /tmp).

        ``unshare`` made the mount namespace and stays in it, so its
        ``/proc/PID/root`` shows the namespace's mounts.
        """
        return Path(f"/proc/{self.process.pid}/root")

    def namespace(self) -> str | None:
        """The daemon's mount namespace (``mnt:[inode]``), None before ``unshare`` made
        it or after the daemon ended."""
        try:
            namespace = os.readlink(f"/proc/{self.process.pid}/ns/mnt")
        except OSError:
            return None
        return None if namespace == os.readlink("/proc/self/ns/mnt") else namespace

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL the daemon: its process group and everything in its namespaces (its
        executors and their Python workers); return once all are gone. Idempotent."""
        namespace = self.namespace()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:  # pragma: no cover - the kernel's job
            raise ClusterError(f"{self.name} (pid {self.process.pid}) outlived SIGKILL") from exc
        try:
            kill_all(self.process.pid, namespace, timeout)
        except ClusterError as exc:  # pragma: no cover
            raise ClusterError(f"{self.name}: {exc}") from None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


class StandaloneCluster:
    """A master on 127.0.0.1 and ``workers`` workers, each in namespaces of its own.

    ``with StandaloneCluster(base) as cluster:`` starts the master (free ports for
    it and its web UI, whose ``/json/`` tells the cluster's state), then the
    workers, ``cores`` and ``memory`` each, and returns once the master lists
    them all alive; leaving the block SIGKILLs every daemon with its namespaces
    (:meth:`Daemon.kill`). ``base`` is a directory the cluster and its drivers share
    (:func:`shared_directory`): the daemons' logs and configuration go under
    ``base/cluster``. Every wait is bounded by ``timeout`` seconds.
    """

    def __init__(
        self,
        base: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not 1 <= workers <= len(WORKER_HOSTS):
            raise ValueError(f"workers must be 1..{len(WORKER_HOSTS)}")
        self.base = base
        self.home = base / "cluster"
        self.worker_count = workers
        self.cores = cores
        self.memory = memory
        self.timeout = timeout
        self.extra_env = dict(env or {})
        self.master_port = free_port()
        self.webui_port = free_port()
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []

    # -- addresses -------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{MASTER_HOST}:{self.webui_port}"

    @property
    def worker_hosts(self) -> list[str]:
        return list(WORKER_HOSTS[: self.worker_count])

    # -- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master, then the workers; wait until the master lists them alive."""
        for name in ("conf", "logs", "pids"):
            (self.home / name).mkdir(parents=True, exist_ok=True)
        self.master = self._launch(
            "master",
            MASTER_HOST,
            MASTER_CLASS,
            ["--host", MASTER_HOST, "--port", str(self.master_port),
             "--webui-port", str(self.webui_port)],
        )  # fmt: skip
        self.wait_for(lambda s: s.get("status") == "ALIVE", "the master to be up")
        for i, host in enumerate(self.worker_hosts, start=1):
            self.workers.append(self._start_worker(i, host))
        self.wait_for(
            lambda s: set(self.alive_worker_hosts(s)) >= set(self.worker_hosts),
            f"workers {', '.join(self.worker_hosts)} to register",
        )

    def _start_worker(self, number: int, host: str) -> Daemon:
        args = [
            "--host", host,
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--work-dir", WORKER_DIR,
            "--webui-port", "0",
            self.master_url,
        ]  # fmt: skip
        env = {"SPARK_WORKER_DIR": WORKER_DIR, "SPARK_LOCAL_DIRS": LOCAL_DIRS}
        return self._launch(f"worker-{number}", host, WORKER_CLASS, args, env)

    def _launch(
        self,
        name: str,
        host: str,
        main_class: str,
        args: list[str],
        env: Mapping[str, str] | None = None,
    ) -> Daemon:
        """``spark-class main_class args`` in new namespaces, bound to ``host``."""
        home = spark_home()
        full_env = {
            **os.environ,
            **self.extra_env,
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(self.home / "conf"),
            "SPARK_LOG_DIR": str(self.home / "logs"),
            "SPARK_PID_DIR": str(self.home / "pids"),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": "256m",
            # no REST submission server: it would take the fixed port 6066
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # temporary files in the private /tmp, whatever the caller's TMPDIR
            "TMPDIR": "/tmp",
            "KEEP_IN_TMP": kept_in_tmp(),
            **(env or {}),
        }
        for name_ in ("SPARK_LOCAL_HOSTNAME", "SPARK_PUBLIC_DNS", "SPARK_REMOTE"):
            full_env.pop(name_, None)
        log = self.home / "logs" / f"{name}.log"
        command = [
            *unshare_command(),
            "sh",
            "-c",
            PRIVATE_TMP.format(size="2g"),
            "sh",
            str(home / "bin" / "spark-class"),
            main_class,
            *args,
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.home,
                start_new_session=True,
            )
        return Daemon(name, host, process, log)

    def stop(self) -> None:
        """SIGKILL every daemon (workers first), each with its namespaces. Idempotent."""
        errors = []
        for daemon in [*self.workers, *([self.master] if self.master else [])]:
            try:
                daemon.kill()
            except ClusterError as exc:  # pragma: no cover
                errors.append(str(exc))
        if errors:  # pragma: no cover
            raise ClusterError("; ".join(errors))

    def kill_worker(self, number: int) -> None:
        """SIGKILL worker ``number`` (1-based) with its executors: a machine lost."""
        self.workers[number - 1].kill()

    # -- state -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The master's state, from its web UI's ``/json/``: workers, applications."""
        # http.client, closed on every path: a urllib request that fails mid-response
        # leaves its socket to the garbage collector (a ResourceWarning, under load).
        connection = http.client.HTTPConnection(MASTER_HOST, self.webui_port, timeout=5)
        try:
            connection.request("GET", "/json/")
            response = connection.getresponse()
            if response.status != 200:
                raise OSError(f"the master's web UI answered {response.status}")
            state: dict[str, Any] = json.loads(response.read())
        except http.client.HTTPException as exc:
            raise OSError(f"the master's web UI: {exc!r}") from None
        except ValueError:  # a page, not the JSON: its handlers are still being attached
            raise OSError("the master's web UI answered /json/ with a page, not JSON") from None
        finally:
            connection.close()
        return state

    @staticmethod
    def alive_worker_hosts(state: Mapping[str, Any]) -> list[str]:
        """The hosts of the workers the master lists ALIVE in ``state``."""
        return [w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def wait_for(self, ready: Any, what: str) -> dict[str, Any]:
        """Poll :meth:`state` until ``ready(state)``; the state. ClusterError after the
        timeout, or as soon as a daemon has died, with its log."""
        deadline = time.monotonic() + self.timeout
        last: Any = None
        while time.monotonic() < deadline:
            for daemon in [*([self.master] if self.master else []), *self.workers]:
                if not daemon.alive and daemon.name not in self._killed():
                    raise ClusterError(
                        f"{daemon.name} exited ({daemon.process.returncode}) while waiting "
                        f"for {what}:\n{daemon.log_tail()}"
                    )
            try:
                state = self.state()
            except OSError as exc:
                last = repr(exc)  # not the exception: its frames hold the connection
            else:
                if ready(state):
                    return state
                last = state
            time.sleep(0.25)
        logs = "\n".join(f"--- {d.name}\n{d.log_tail(1500)}" for d in self._daemons())
        raise ClusterError(f"timed out after {self.timeout}s waiting for {what}: {last}\n{logs}")

    def _daemons(self) -> list[Daemon]:
        return [*([self.master] if self.master else []), *self.workers]

    def _killed(self) -> set[str]:
        return {d.name for d in self.workers if d.process.returncode == -signal.SIGKILL}

    def executor_logs(self, number: int) -> dict[str, str]:
        """Worker ``number``'s executor logs (``app/executor/stderr``: text), read in its
        private /tmp through its namespace; empty once the worker is gone."""
        daemon = self.workers[number - 1]
        work = daemon.root() / WORKER_DIR.lstrip("/")
        logs: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for path in sorted(work.glob("*/*/stderr")):
                with contextlib.suppress(OSError):
                    logs[f"{path.parent.parent.name}/{path.parent.name}/stderr"] = path.read_text(
                        encoding="utf-8", errors="replace"
                    )
        return logs

    def driver_conf(self, **more: str) -> dict[str, str]:
        """The settings a driver on this cluster runs with: the driver on 127.0.0.1, an
        executor of one core and 512 MB per worker, the first job held back until every
        worker's executor has registered (so that all take tasks from the start), and
        the driver's local directory in ``base``; ``more`` on top."""
        return {
            "spark.driver.host": MASTER_HOST,
            "spark.driver.bindAddress": MASTER_HOST,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.cores.max": str(self.cores * self.worker_count),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(self.timeout)}s",
            # the driver's scratch files (block manager, temporary directories) here too
            "spark.local.dir": str(self.base / "driver-local"),
            **more,
        }

    def driver_conf_dir(self, conf: Mapping[str, str], name: str = "driver-conf") -> Path:
        """A ``SPARK_CONF_DIR`` whose ``spark-defaults.conf`` holds ``conf``: how a driver
        started by a command (``spark-submit``, PySpark's gateway) takes settings it has
        no option for. Its own directory, apart from the daemons'."""
        directory = self.base / name
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{key} {value}\n" for key, value in sorted(conf.items())]
        (directory / "spark-defaults.conf").write_text("".join(lines), encoding="utf-8")
        return directory
