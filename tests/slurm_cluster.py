"""A throwaway single-node SLURM cluster (munged + slurmctld + slurmd) for tests.

Everything lives in one temporary directory: the munge key and socket, a ``slurm.conf``
generated for this host, state, spool, logs and PID files. Daemons run in the foreground as
children of the test process and are stopped by PID. Client commands find the cluster through
``SLURM_CONF`` (see :attr:`SlurmCluster.env`). There is no slurmdbd, so ``sacct`` cannot see
jobs: clients must query job states with ``squeue``, which keeps finished jobs for ``MinJobAge``.

The node advertises ``gpu`` GRES (backed by copies of /dev/null), so jobs that request
``--gpus`` are scheduled as on a GPU node; no GPU is actually attached.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "sinfo",
    "scancel",
)
# Finished jobs stay visible to squeue this long; far above any status-check interval.
MIN_JOB_AGE_S = 600
FAKE_GPUS = 2


def host_cpus() -> int:
    """The CPUs this process may use (what ``nproc`` says)."""
    return len(os.sched_getaffinity(0))


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "starting SLURM daemons needs root (munged runs as the munge user)"
    missing = [name for name in DAEMONS if _which(name) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (install the munge package)"
    return None


@dataclass
class SlurmCluster:
    """A running cluster; :meth:`stop` ends every daemon it started."""

    root: Path
    conf: Path
    node: str
    cpus: int
    memory_mb: int
    partitions: tuple[str, ...]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The current environment plus ``SLURM_CONF`` pointing at this cluster.

        ``PATH`` starts with a ``srun`` shim that sets ``SLURM_CONF`` again: Snakemake's jobstep
        executor drops every ``SLURM_*`` variable before its nested ``srun`` (fine where
        slurm.conf sits at its default path, which this cluster's does not).
        """
        path = f"{self.root / 'bin'}:{os.environ.get('PATH', '')}"
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(
            args, env=self.env, capture_output=True, text=True, check=check, timeout=60
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every daemon log, to explain a failure."""
        parts = []
        for log in sorted([*self.root.glob("*.log"), *self.root.glob("*.out")]):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel leftover jobs, then stop the daemons by PID (slurmd first, munged last)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", f"--nodelist={self.node}", check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(
    partitions: tuple[str, ...] = ("debug",), min_memory_mb: int = 0, timeout_s: float = 60.0
) -> SlurmCluster:
    """Start munged, slurmctld and slurmd in a fresh temporary directory.

    The node has this host's CPUs and is in every partition named (the first is the default).
    It advertises at least ``min_memory_mb`` of memory, more than the host has if need be:
    nothing enforces memory limits here (no cgroups), and jobs that ask for a GPU node's memory
    must still be schedulable. Raises RuntimeError (after stopping whatever did start) when the
    node does not come up.
    """
    if not partitions:
        raise ValueError("a cluster needs at least one partition")
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    root = Path(tempfile.mkdtemp(prefix="decodecliff-slurm-"))
    root.chmod(0o755)  # munged (user munge) must reach its files below
    node = socket.gethostname().split(".")[0]
    cluster = SlurmCluster(
        root=root,
        conf=root / "slurm.conf",
        node=node,
        cpus=host_cpus(),
        memory_mb=max(_real_memory_mb(), min_memory_mb),
        partitions=tuple(partitions),
    )
    try:
        _write_srun_shim(cluster)
        socket_path = _start_munge(cluster)
        _write_conf(cluster, socket_path)
        for name, cmd in (
            ("slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)]),
            ("slurmd", ["slurmd", "-D", "-f", str(cluster.conf), "-N", node]),
        ):
            cluster.procs[name] = _spawn(cluster, name, cmd)
        _wait_idle(cluster, timeout_s)
    except BaseException as exc:
        logs = cluster.log_tail()
        cluster.stop()
        if isinstance(exc, Exception):
            raise RuntimeError(f"SLURM cluster did not start: {exc}\n{logs}") from exc
        raise
    return cluster


def _which(name: str) -> str | None:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _spawn(
    cluster: SlurmCluster, name: str, cmd: list[str], user: str | None = None
) -> subprocess.Popen:
    cmd = [_which(cmd[0]) or cmd[0], *cmd[1:]]
    with open(cluster.root / f"{name}.out", "wb") as out:  # the child keeps its own copy
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env,
            user=user,
            start_new_session=True,
        )


def _write_srun_shim(cluster: SlurmCluster) -> None:
    """bin/srun: the real srun with SLURM_CONF set (see SlurmCluster.env)."""
    bindir = cluster.root / "bin"
    bindir.mkdir()
    shim = bindir / "srun"
    shim.write_text(f'#!/bin/sh\nSLURM_CONF={cluster.conf} exec {_which("srun")} "$@"\n')
    shim.chmod(0o755)


def _start_munge(cluster: SlurmCluster) -> Path:
    """A munged of our own: its own key and socket, running as the munge user."""
    mdir = cluster.root / "munge"
    mdir.mkdir()
    mdir.chmod(0o711)  # munged insists that clients can reach its socket
    key = mdir / "munge.key"
    subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True)
    munge = pwd.getpwnam("munge")
    for path in (mdir, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    sock = mdir / "munge.socket"
    cmd = [
        "munged",
        "--foreground",
        f"--key-file={key}",
        f"--socket={sock}",
        f"--pid-file={mdir / 'munged.pid'}",
        f"--seed-file={mdir / 'munged.seed'}",
        f"--log-file={mdir / 'munged.log'}",
    ]
    cluster.procs["munged"] = _spawn(cluster, "munged", cmd, user="munge")
    _wait_for(lambda: sock.exists(), 15, "munged socket", cluster.procs["munged"])
    return sock


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_memory_mb() -> int:
    """Memory to advertise: a bit under what slurmd detects, so the node is not drained."""
    out = subprocess.run(
        [_which("slurmd"), "-C"], capture_output=True, text=True, check=True
    ).stdout
    detected = int(out.split("RealMemory=")[1].split()[0])
    return max(256, int(detected * 0.9))


def _fake_gpu_devices(root: Path) -> list[str]:
    """Device files for the GPU GRES: copies of /dev/null (slurmd wants character devices)."""
    null = os.stat("/dev/null").st_rdev
    paths = []
    try:
        for i in range(FAKE_GPUS):
            path = root / f"gpu{i}"
            os.mknod(path, 0o666 | stat.S_IFCHR, null)
            paths.append(str(path))
    except OSError:  # no CAP_MKNOD (e.g. an unprivileged container): one GPU slot
        return ["/dev/null"]
    return paths


def _write_conf(cluster: SlurmCluster, munge_socket: Path) -> None:
    root = cluster.root
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    mem = cluster.memory_mb
    gpus = _fake_gpu_devices(root)
    (root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={','.join(gpus)}\n")
    conf = f"""\
ClusterName=decodecliff-test
SlurmctldHost={cluster.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Jobs without a memory request get a share, so several fit on the node at once.
DefMemPerCPU={max(64, mem // (2 * cluster.cpus))}
MinJobAge={MIN_JOB_AGE_S}
ReturnToService=2
# The node is as configured here, not as probed (memory may be advertised above the host's).
SlurmdParameters=config_overrides
SlurmdTimeout=60
GresTypes=gpu
"""
    conf += (
        f"NodeName={cluster.node} NodeAddr=127.0.0.1 CPUs={cluster.cpus} RealMemory={mem}"
        f" Gres=gpu:{len(gpus)} State=UNKNOWN\n"
    )
    for i, name in enumerate(cluster.partitions):
        default = "YES" if i == 0 else "NO"
        conf += f"PartitionName={name} Nodes={cluster.node} Default={default} State=UP\n"
    cluster.conf.write_text(conf)


def _wait_for(ok, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _wait_idle(cluster: SlurmCluster, timeout_s: float) -> None:
    def idle() -> bool:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}")
        res = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        states = res.stdout.split()
        return res.returncode == 0 and bool(states) and set(states) == {"idle"}

    _wait_for(idle, timeout_s, f"node {cluster.node} to become idle")
