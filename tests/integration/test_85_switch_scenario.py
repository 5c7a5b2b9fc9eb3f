"""The switch scenario: a host goes from vm-passthrough to container and back (molecule, scenario switch).

It starts, in the background, from the host the vm_passthrough scenario of test_40 left prepared (molecule
create reuses it) as soon as that scenario has passed, and runs while the image, API server and docs tests
use the controller; this test waits for it. Each switch undoes the old type and reboots once; host_verify
fails the scenario when the container state keeps anything of the VM stack.
"""

from conftest import action_output, reboots


def test_switch_scenario(switch_run):
    assert switch_run is not None, "the switch scenario starts from the vm_passthrough host, whose scenario failed"
    rc, out, elapsed = switch_run.results()["switch"]
    assert rc == 0, out[-10000:]
    # The host was already a vm-passthrough node: no reboot on converge; one per switch.
    assert reboots(action_output(out, "converge")) == 0
    assert reboots(action_output(out, "side_effect")) == 2
    assert reboots(action_output(out, "idempotence")) == 0
    assert " passed" in action_output(out, "verify")
    print("switch: molecule test %.0fs" % elapsed)
