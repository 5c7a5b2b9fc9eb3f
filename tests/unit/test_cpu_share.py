"""scripts/cpu_share.py: the command's exit code, its CPU counted, the JSON report."""

import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, "scripts", "cpu_share.py")


def test_counts_a_busy_child_and_keeps_its_exit_code(tmp_path):
    out = tmp_path / "share.json"
    busy = "import time\nend = time.process_time() + 4\nwhile time.process_time() < end: pass\nraise SystemExit(3)"
    proc = subprocess.run([sys.executable, SCRIPT, str(out), "--", sys.executable, "-c", busy],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 3, proc.stderr
    report = json.loads(out.read_text())
    assert report["returncode"] == 3
    assert report["wall_seconds"] >= 4
    # The child ran for about 4 CPU seconds and lived through samples: it is counted as a python process.
    assert report["kinds"].get("other", 0) >= 2.5, report
    assert report["busy_core_seconds"] >= report["kinds"]["other"] - 0.5
    assert proc.stdout.startswith("cpu_share: ")


def test_usage_without_a_command():
    proc = subprocess.run([sys.executable, SCRIPT, "out.json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: cpu_share.py OUTPUT -- COMMAND" in proc.stderr


def test_kinds_name_the_lab_hosts_and_the_api_server():
    sys.path.insert(0, os.path.join(TOP, "scripts"))
    try:
        import cpu_share  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    assert cpu_share.kind_of("qemu-system-x86_64 -name lab-vgpu -machine q35,accel=tcg") == "qemu lab-vgpu"
    assert cpu_share.kind_of("/x/.cache/kube/bin-v1.35.4/kube-apiserver --etcd-servers=http://127.0.0.1:1") == \
        "kube-apiserver"
    assert cpu_share.kind_of("/venv/bin/python /venv/bin/ansible-playbook playbooks/site.yml") == "ansible-playbook"
    assert cpu_share.kind_of("") == "kernel threads"
