"""Unit tests of the lab scripts' shared helpers: progress lines of long steps, and the command runner under them.

The commands are real (the test's own Python interpreter printing lines slowly); only the interval is short.
"""

import importlib.util
import os
import re
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load():
    spec = importlib.util.spec_from_file_location("labcommon_under_test", os.path.join(TOP, "lab", "labcommon.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


labcommon = load()


class LabError(Exception):
    pass


@pytest.fixture
def lab(monkeypatch):
    """A Lab whose log lines are collected; progress lines every 0.2 s."""
    monkeypatch.setenv(labcommon.PROGRESS_ENV, "0.2")
    the_lab = labcommon.Lab("testlab", LabError)
    the_lab.logged = []
    monkeypatch.setattr(the_lab, "log", the_lab.logged.append)
    return the_lab


def slow_printer(lines, pause, rc=0, to_stderr=False):
    stream = "sys.stderr" if to_stderr else "sys.stdout"
    code = ("import sys, time\n"
            "for i in range(%d):\n"
            "    print('step %%d of the work' %% i, file=%s, flush=True)\n"
            "    time.sleep(%r)\n"
            "sys.exit(%d)\n") % (lines, stream, pause, rc)
    return [sys.executable, "-c", code]


def test_a_long_command_says_what_it_is_at_and_returns_its_whole_output(lab):
    proc = lab.run(slow_printer(8, 0.15), progress="counting")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["step %d of the work" % i for i in range(8)]
    still = [line for line in lab.logged if line.startswith("still counting (")]
    # Before the command's first line (a Python start on a loaded machine can outlast the 0.2 s interval) a line
    # names the elapsed time only; from then on also the lines so far and the latest one.
    quiet = [line for line in still if " line" not in line]
    assert all(re.fullmatch(r"still counting \(\d+s\)", line) for line in quiet), quiet
    still = [line for line in still if " line" in line]
    assert still, lab.logged
    assert all(": step " in line and "of the work" in line for line in still), still
    counts = [int(line.split(", ")[1].split()[0]) for line in still]
    assert counts == sorted(counts) and counts[-1] <= 8
    assert lab.logged[-1].startswith("counting: done in ")


def test_output_on_stderr_counts_too(lab):
    proc = lab.run(slow_printer(6, 0.3, to_stderr=True), progress="compiling")
    assert proc.stderr.count("step") == 6 and proc.stdout == ""
    assert any(line.startswith("still compiling (") and ": step " in line for line in lab.logged), lab.logged


def test_a_failing_command_raises_the_labs_error_with_its_last_lines_and_no_done_line(lab):
    with pytest.raises(LabError) as failed:
        lab.run(slow_printer(4, 0.1, rc=3), progress="failing")
    assert "rc=3" in str(failed.value) and "step 3 of the work" in str(failed.value)
    assert not any("done in" in line for line in lab.logged)


def test_a_command_past_its_timeout_is_killed_and_named(lab):
    with pytest.raises(LabError) as failed:
        lab.run(slow_printer(50, 0.2), timeout=0.5, progress="waiting")
    assert "timed out after 0.5s" in str(failed.value)
    assert not any("done in" in line for line in lab.logged)


def test_a_missing_command_is_named(lab):
    with pytest.raises(LabError, match="command not found: no-such-tool-here"):
        lab.run(["no-such-tool-here"], progress="trying")


def test_input_reaches_the_command(lab):
    proc = lab.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], input_text="label: dos\n",
                   progress="partitioning")
    assert proc.stdout.strip() == "LABEL: DOS"


def test_a_quick_step_says_nothing(lab, monkeypatch):
    # A step shorter than the interval: the fixture's 0.2 s is shorter than a Python start on a loaded machine
    # (seen beside the integration tier: "still being quick ...: done in 0s").
    monkeypatch.setenv(labcommon.PROGRESS_ENV, "60")
    proc = lab.run([sys.executable, "-c", "print('fast')"], progress="being quick")
    assert proc.stdout == "fast\n"
    assert lab.logged == []


def test_a_step_with_a_status_shows_it_and_survives_a_failing_status(lab):
    calls = []

    def status():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("console log not there yet")
        return "[  OK  ] Reached target multi-user.target" + " x" * 100

    with labcommon.Progress(lab, "booting", status=status):
        labcommon.time.sleep(0.7)
    still = [line for line in lab.logged if line.startswith("still booting")]
    assert len(still) >= 2, lab.logged
    assert still[0] == "still booting (0s)"
    assert "Reached target" in still[-1] and still[-1].endswith("...")
    assert len(still[-1].split(": ", 1)[1]) == labcommon.Progress.LAST_WIDTH


def test_say_done_false_leaves_the_end_to_the_caller(lab):
    with labcommon.Progress(lab, "booting", say_done=False):
        labcommon.time.sleep(0.5)
    assert lab.logged and not any("done in" in line for line in lab.logged)


@pytest.mark.parametrize("value, seconds", [(None, 30), ("5", 5.0), ("0", 0), ("-3", 0), ("inf", 0), ("nan", 0),
                                            ("soon", 0), ("0.5", 0.5)])
def test_the_interval_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(labcommon.PROGRESS_ENV, raising=False)
    else:
        monkeypatch.setenv(labcommon.PROGRESS_ENV, value)
    assert labcommon.progress_interval() == seconds


def test_no_interval_means_no_lines(monkeypatch):
    monkeypatch.setenv(labcommon.PROGRESS_ENV, "0")
    the_lab = labcommon.Lab("testlab", LabError)
    logged = []
    monkeypatch.setattr(the_lab, "log", logged.append)
    the_lab.run(slow_printer(3, 0.1), progress="quietly")
    assert logged == []


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (185, "3m05s"),
                                           (3599, "59m59s"), (3720, "1h02m")])
def test_durations_read_as_people_write_them(seconds, text):
    assert labcommon.duration(seconds) == text


@pytest.mark.parametrize("raw, shown", [
    # systemd's coloured status on a serial console (issue 26: the colour codes reached the progress lines)
    ("[\x1b[0;32m  OK  \x1b[0m] Mounted \x1b[0;1;39msys-kernel-debug.m\u2026nt\x1b[0m.",
     "[ OK ] Mounted sys-kernel-debug.m\u2026nt."),
    # a counter that redraws its line: what the last carriage return drew, not every state run together
    ("Progress: 10%\rProgress: 55%\r", "Progress: 55%"),
    ("A stop job is running\r\x1b[K[ ***  ] A stop job is running (5s / 1min 30s)\r\n",
     "[ *** ] A stop job is running (5s / 1min 30s)"),
    # a window title, a character set change, cursor save/restore, a bell, a lone escape at the end
    ("\x1b]0;root@gpulab: ~\x07hello\tworld", "hello world"),
    ("a\x1b(Bb\x1b7c\x1b8\x07d\x1b", "abcd"),
    ("  \r\n", ""),
    ("", ""),
])
def test_plain_text_shows_a_line_as_the_terminal_did(raw, shown):
    assert labcommon.plain_text(raw) == shown


def test_a_progress_line_shows_the_console_without_control_sequences(lab):
    def status():
        return "[\x1b[0;32m  OK  \x1b[0m] Reached target \x1b[0;1;39mnetwork.target\x1b[0m - Network.\r"

    with labcommon.Progress(lab, "booting", status=status):
        labcommon.time.sleep(0.5)
    still = [line for line in lab.logged if line.startswith("still booting")]
    assert still and still[-1].endswith(": [ OK ] Reached target network.target - Network."), lab.logged
    assert not any("\x1b" in line or "\r" in line for line in lab.logged)
