"""The sandbox a return runs in, tried with plain commands (course_lib/teaching/grading/sandbox.py).
These need bubblewrap (`make sandbox` installs it): without it they fail, saying so."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.teaching.grading import sandbox as sandbox_module
from course_lib.teaching.grading.sandbox import Sandbox, SandboxUnavailable, find_sandbox, run_limited

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sandbox():
    return find_sandbox()  # raises, naming how to install bubblewrap, where there is none


def run_in(sandbox, tmp_path, script, read_only=(), writable=(), limit=60.0):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    command, environment = sandbox.command([sys.executable, "-I", "-c", script], read_only=read_only,
                                           writable=[work, *writable], cwd=work)
    log = tmp_path / "log.txt"
    exit_code, killed = run_limited(command, limit, log, environment=environment)
    return exit_code, killed, log.read_text()


def test_without_bwrap_grading_refuses_unless_told_unsafe(monkeypatch):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        find_sandbox()
    assert find_sandbox(unsafe=True) == Sandbox(None)


def test_a_return_sees_only_what_it_is_given(sandbox, tmp_path):
    """Its folder is writable; the package it is given is read-only; the repository, the home
    folder, the other folders of the grader's and the network are not there; /tmp is its own."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "module.py").write_text("x = 1")
    classmate = tmp_path / "classmate.ipynb"
    classmate.write_text("secret answer")
    host_marker = Path("/tmp") / f"course_lib_sandbox_test_{os.getpid()}"
    script = f"""
import os, socket, pathlib
results = []
def attempt(name, action):
    try:
        action()
        results.append(name + ":done")
    except OSError as error:
        results.append(name + ":" + type(error).__name__ + str(error.errno))
attempt("own_folder", lambda: pathlib.Path("out.txt").write_text("ok"))
attempt("package", lambda: pathlib.Path({str(package / "module.py")!r}).write_text("x = 2"))
attempt("plant", lambda: pathlib.Path({str(package / "json.py")!r}).write_text("x = 2"))
attempt("classmate", lambda: pathlib.Path({str(classmate)!r}).read_text())
attempt("repository", lambda: pathlib.Path({str(REPO_ROOT / "escaped.txt")!r}).write_text("x"))
attempt("tmp", lambda: pathlib.Path({str(host_marker)!r}).write_text("x"))
attempt("home", lambda: (pathlib.Path.home() / "escaped.txt").write_text("x"))
attempt("network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
print(";".join(results), os.getuid())
"""
    exit_code, killed, output = run_in(sandbox, tmp_path, script, read_only=[package])
    assert (exit_code, killed) == (0, None), output
    seen = dict(part.split(":") for part in output.split()[0].split(";"))
    assert seen["own_folder"] == "done" and (tmp_path / "work" / "out.txt").read_text() == "ok"
    assert seen["package"] == seen["plant"] == "OSError30", seen  # read-only file system
    assert seen["classmate"] == "FileNotFoundError2", seen
    # Read-only where the sandbox shows a folder above it (the venv inside the checkout), missing where
    # it shows none (the repository away from the Python), or, for a checkout under /tmp, inside the
    # return's own /tmp (checked below: nothing came out either way).
    assert seen["repository"] in (("done",) if REPO_ROOT.is_relative_to("/tmp") else ("OSError30", "FileNotFoundError2")), seen
    assert seen["tmp"] == seen["home"] == "done", seen  # into its own /tmp, gone with it
    assert seen["network"].startswith("OSError"), seen
    assert output.split()[1] == str(sandbox_module.SANDBOX_USER)
    assert (package / "module.py").read_text() == "x = 1" and not (package / "json.py").exists()
    assert not (REPO_ROOT / "escaped.txt").exists() and not host_marker.exists()
    assert not (Path.home() / "escaped.txt").exists()


def test_processes_left_behind_die_with_the_sandbox(sandbox, tmp_path):
    """A daemon (setsid, double fork) started by the return is killed when the return ends."""
    token = f"course_lib_daemon_{os.getpid()}_{time.monotonic_ns()}"
    script = f"""
import subprocess
subprocess.Popen(["setsid", "sh", "-c", "sleep 300 # {token}"], start_new_session=True)
"""
    exit_code, killed, output = run_in(sandbox, tmp_path, script)
    assert exit_code == 0, output
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
    assert left == "", f"left behind: {left}"


def test_a_sandbox_past_its_limit_is_killed_with_everything_in_it(sandbox, tmp_path):
    token = f"course_lib_hang_{os.getpid()}_{time.monotonic_ns()}"
    script = f"""
import subprocess, time
subprocess.Popen(["setsid", "sh", "-c", "sleep 300 # {token}"], start_new_session=True)
time.sleep(300)
"""
    exit_code, killed, _ = run_in(sandbox, tmp_path, script, limit=3)
    assert exit_code is None and killed == "stopped after 3 s, its limit"
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout == ""
