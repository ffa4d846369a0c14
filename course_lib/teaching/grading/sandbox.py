"""The sandbox each return runs in, and the limits on its processes.

Grading runs students' code. Restoring files after a return has run cannot stop a return that
reaches them while it runs (or leaves a process behind to reach them later), so each return
runs inside bubblewrap (``bwrap``: packaged by Debian, Ubuntu and Fedora; what Flatpak runs
apps in), which builds it a world of its own from Linux namespaces:

- a file system holding only the system's programs and libraries, the Python and its
  packages, read-only, and the paths the grader names (the return's package copy read-only,
  its working folders writable): no repository, no other return, no grader output, no home;
- a private, empty ``/tmp`` (its home, its caches: inductor's and Triton's too);
- no network (a loopback of its own, for the notebook's kernel);
- a process namespace: when the sandbox's first process ends, or the grader kills it at a
  limit, the kernel kills every process left in it (``setsid``, daemons included);
- no capabilities, an unprivileged user, and only the environment variables listed here.

Without bwrap, grading refuses to run unless told it may (``make grade UNSAFE=1``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BWRAP = "bwrap"
INSTALL_SANDBOX_HINT = ("install bubblewrap (Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
                        "bubblewrap), or run `make grade UNSAFE=1` to grade without a sandbox, on a machine you can lose")
SANDBOX_USER = 65534  # "nobody": the return owns no file of the grader's, even when the grader runs as root
MERGED_USR_LINKS = ("/bin", "/lib", "/lib64", "/sbin")  # links into /usr on merged-/usr systems, folders elsewhere
# What of /etc a Python, its libraries and a Jupyter kernel read; the rest (shadow, keys) stays out.
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd",
                "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/hosts", "/etc/mime.types")
GPU_DEVICES = "/dev/nvidia*"
# The grader's environment variables a return gets (the rest may hold secrets).
PASSED_ENVIRONMENT = ("TRITON_", "CUDA_", "NVIDIA_", "TORCH", "OMP_", "MKL_", "LANG", "LC_")
MEMORY_POLL_SECONDS = 0.2


class SandboxUnavailable(RuntimeError):
    """No sandbox on this machine, and grading was not told it may run without one."""


def _python_folders() -> list[str]:
    """The folders the grader's Python and its packages live in (a venv and the Python it was made from)."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parents[1])}
    return sorted(folders)


def _sandbox_environment(environment: dict[str, str]) -> dict[str, str]:
    passed = {name: value for name, value in os.environ.items() if name.startswith(PASSED_ENVIRONMENT)}
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {**passed, "HOME": "/tmp", "TMPDIR": "/tmp", "PATH": path, **environment}


@dataclass(frozen=True)
class Sandbox:
    """How grading runs a return's processes: inside bwrap at ``executable``, or (None) as
    they are, which only ``make grade UNSAFE=1`` asks for."""

    executable: str | None

    @property
    def name(self) -> str:
        return "bubblewrap" if self.executable else "none (UNSAFE)"

    def command(self, command: list[str], *, read_only=(), writable=(), cwd: Path,
                environment: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that run ``command`` from ``cwd`` seeing only the system, the
        Python, ``read_only`` and ``writable`` (each at its own path) and a private ``/tmp``."""
        environment = _sandbox_environment(environment or {})
        if self.executable is None:
            return list(command), {**os.environ, **environment}
        arguments = [self.executable, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_USER),
                     "--gid", str(SANDBOX_USER), "--die-with-parent", "--new-session", "--clearenv"]
        if os.geteuid() == 0:  # bwrap keeps a root caller's capabilities unless told not to
            arguments += ["--cap-drop", "ALL"]
        for name, value in sorted(environment.items()):
            arguments += ["--setenv", name, value]
        arguments += ["--ro-bind", "/usr", "/usr"]
        for link in MERGED_USR_LINKS:
            if os.path.islink(link):
                arguments += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                arguments += ["--ro-bind", link, link]
        for path in SYSTEM_FILES:
            arguments += ["--ro-bind-try", path, path]
        # /tmp first: the grader's own scratch folders may lie under the host's /tmp.
        arguments += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for device in sorted(glob.glob(GPU_DEVICES)):  # a GPU grader's checkers run on the GPU
            arguments += ["--dev-bind", device, device]
        if glob.glob(GPU_DEVICES):
            arguments += ["--ro-bind", "/sys", "/sys"]
        for folder in _python_folders():
            arguments += ["--ro-bind", folder, folder]
        for path in map(str, read_only):
            arguments += ["--ro-bind", path, path]
        for path in map(str, writable):
            arguments += ["--bind", path, path]
        # Last: the sandbox's own root (where the mount points above were made) becomes read-only too.
        arguments += ["--remount-ro", "/", "--chdir", str(cwd), "--", *command]
        return arguments, dict(os.environ)


def find_sandbox(unsafe: bool = False) -> Sandbox:
    """bwrap, once it is seen to work here (a kernel may forbid the user namespaces it needs);
    with ``unsafe``, no sandbox when there is none; else :class:`SandboxUnavailable`."""
    executable = shutil.which(BWRAP)
    if executable is not None:
        probe, _ = Sandbox(executable).command(["true"], cwd=Path("/"))
        result = subprocess.run(probe, capture_output=True, text=True)
        if result.returncode == 0:
            return Sandbox(executable)
        why = f"bwrap is installed but cannot make a sandbox here: {result.stderr.strip()}"
    else:
        why = "no sandbox: bwrap is not installed"
    if unsafe:
        print(f"warning: {why}; grading without a sandbox (UNSAFE)", file=sys.stderr)
        return Sandbox(None)
    raise SandboxUnavailable(f"{why}. To grade, {INSTALL_SANDBOX_HINT}.")


def _family(pid: int, psutil) -> list:
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_family(process, psutil) -> None:
    """Kill ``process`` and every process it started. In bwrap, killing the sandbox ends its
    process namespace, which kills whatever is left in it; this also covers UNSAFE runs."""
    for member in reversed(_family(process.pid, psutil)):
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()


def _family_memory(process, psutil) -> int:
    """Resident host memory of ``process`` and every process it started, in bytes (in bwrap:
    the whole sandbox, whose processes stay its descendants however they detach)."""
    total = 0
    for member in _family(process.pid, psutil):
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_limited(command: list[str], limit: float, log_path: Path, *, environment: dict[str, str] | None = None,
                stdin_text: str = "", memory_limit: float | None = None,
                progress: Callable[[], int] | None = None,
                limit_name: str = "its limit") -> tuple[int | None, str | None]:
    """Run ``command`` (``stdin_text`` on its stdin, its output to ``log_path``); kill it and its
    processes past ``limit`` seconds, or once they hold more than ``memory_limit`` bytes.
    With ``progress`` (a count that grows as the command gets work done) the limit starts again
    each time the count grows: ``limit`` is then a limit per piece of work.
    Returns (exit code, None) or (None, why it was killed, ``limit_name`` naming the limit)."""
    import psutil

    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True,
                                   env=environment)
        try:
            process.stdin.write(stdin_text)
            process.stdin.close()
        except BrokenPipeError:  # it ended before reading
            pass
        deadline, done = time.monotonic() + limit, 0
        while True:
            try:
                return process.wait(timeout=max(0.0, min(MEMORY_POLL_SECONDS, deadline - time.monotonic()))), None
            except subprocess.TimeoutExpired:
                pass
            if progress is not None and progress() > done:
                deadline, done = time.monotonic() + limit, progress()
            if time.monotonic() >= deadline:
                _kill_family(process, psutil)
                return None, f"stopped after {limit:g} s, {limit_name}"
            if memory_limit is not None and _family_memory(process, psutil) > memory_limit:
                _kill_family(process, psutil)
                return None, (f"stopped when it held more than {memory_limit / 2**30:g} GiB of host memory, "
                              f"{limit_name}")
