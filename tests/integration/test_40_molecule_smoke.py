"""The molecule smoke scenario on a lab host: create, check, converge (reboot), idempotence, verify."""

from conftest import run


def test_molecule_smoke_scenario(running_lab):
    proc = run(["molecule", "test", "-s", "smoke"], timeout=3000)
    out = proc.stdout
    assert proc.returncode == 0, out[-8000:]
    # The converge really rebooted the host, and the second converge changed nothing.
    assert "Reboot into the new command line" in out
    assert "Idempotence test failed" not in out
    assert " passed" in out
