"""The main job, playbooks/site.yml, on the lab after the host scenarios left every host prepared, run once,
through ansible-runner the way AWX runs a job.

AWX (and Automation Platform) does not call ansible-playbook itself: it lays out a private data dir
(project/, inventory/ with an executable inventory script, env/extravars, env/envvars, env/settings)
and hands it to ansible-runner, then reads the job's events. The run here does the same with the lab
inventory; one test asserts the run's status, return code and each host's events, the other what the play
printed: nothing to do on the hosts (no change, no reboot) and every host ready, whichever way the hosts were
prepared before (molecule scenarios through prepare_hosts.yml, the switch playbook, the drift repair of
test_86), and the cluster half's labels and KubeVirt entries on the real API server.
"""

import json
import os
import re
import stat
import subprocess
import sys

import ansible_runner
import pytest
import yaml

from conftest import TOP, lab, run as run_cmd

LAB_INVENTORY = os.path.join(TOP, "inventories", "lab")

INVENTORY_SCRIPT = """#!%(python)s
# Inventory script, as AWX writes one into a job's private data dir.
import json
import sys

DATA = %(data)s
if len(sys.argv) > 1 and sys.argv[1] == "--host":
    print(json.dumps(DATA["_meta"]["hostvars"].get(sys.argv[2], {})))
else:
    print(json.dumps(DATA))
"""


def awx_inventory(source):
    """The inventory as AWX hands it to a job: one JSON document, hosts' variables resolved per host."""
    # --export keeps variables where the inventory defines them (group_vars/all as the "all" group's
    # variables, as AWX imports them), so the implicit localhost of the cluster play sees them too.
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", source, "--list",
                          "--export"],
                         cwd=TOP, check=True, text=True, stdout=subprocess.PIPE).stdout
    # AWX stores inventory variables as text, so a path relative to the inventory must be resolved
    # before it leaves the inventory directory.
    return json.loads(out.replace("{{ inventory_dir }}", source))


def private_data_dir(base, extravars, envvars):
    """Lay out a private data dir as AWX does for a job; return its path."""
    pdd = os.path.join(base, "pdd")
    for sub in ("env", "inventory"):
        os.makedirs(os.path.join(pdd, sub))
    # AWX copies the project revision into project/; the checkout stands in for it.
    os.symlink(TOP, os.path.join(pdd, "project"))
    script = os.path.join(pdd, "inventory", "hosts")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(INVENTORY_SCRIPT % {"python": sys.executable, "data": repr(awx_inventory(LAB_INVENTORY))})
    os.chmod(script, stat.S_IRWXU)
    for name, data in (("extravars", extravars), ("envvars", envvars),
                       ("settings", {"job_timeout": 2400, "suppress_ansible_output": True})):
        with open(os.path.join(pdd, "env", name), "w", encoding="utf-8") as handle:
            json.dump(data, handle)
    return pdd


def host_events(run, event):
    return [e for e in run.events if e.get("event") == event]


@pytest.fixture(scope="module")
def site_run(settled_lab, kube_api, tmp_path_factory):  # pylint: disable=unused-argument
    """(runner result, its stdout): site.yml once through ansible-runner on the settled lab."""
    # The kubeconfig as AWX's kubeconfig credential type hands it over: an extra variable naming a file.
    extravars = {"awx_job_id": 15, "awx_job_template_name": "gpuops full site", "tower_job_id": 15,
                 "gpuops_kubeconfig": kube_api["kubeconfig"]}
    envvars = {
        "ANSIBLE_CONFIG": os.path.join(TOP, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(TOP, ".build", "collections"),
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_NOCOLOR": "True",
        "PATH": os.pathsep.join([kube_api["bin_dir"], os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    pdd = private_data_dir(str(tmp_path_factory.mktemp("runner")), extravars, envvars)
    result = ansible_runner.run(private_data_dir=pdd, playbook="playbooks/site.yml",
                                inventory=os.path.join(pdd, "inventory", "hosts"),
                                extravars={"awx_job_launch_type": "manual"}, envvars={"JOB_ID": "15"},
                                quiet=True, timeout=2400)
    return result, result.stdout.read()


def test_site_through_ansible_runner(site_run, settled_lab):
    run, stdout = site_run
    failed = [(e["event_data"].get("host"), e["event_data"].get("task"), e["event_data"].get("res", {}).get("msg"))
              for e in host_events(run, "runner_on_failed") if not e["event_data"].get("ignore_errors")]
    assert run.status == "successful" and run.rc == 0, (run.status, run.rc, failed, stdout[-3000:])

    unreachable = [e["event_data"].get("host") for e in host_events(run, "runner_on_unreachable")]
    assert not failed and not unreachable, (failed, unreachable)
    assert set(settled_lab) <= set(run.stats["ok"]), run.stats
    assert not run.stats["failures"] and not run.stats["dark"], run.stats

    # The extra variables reached the play, as AWX's do.
    start = host_events(run, "playbook_on_start")
    assert start and start[0]["event_data"].get("playbook") == "playbooks/site.yml"

    # Each host's readiness report names its workload type from the inventory groups, and says ready.
    summaries = {}
    for event in host_events(run, "runner_on_ok"):
        facts = event["event_data"].get("res", {}).get("ansible_facts") or {}
        report = facts.get("host_verify_report")
        if isinstance(report, dict):
            summaries[event["event_data"]["host"]] = report
    inventory = awx_inventory(LAB_INVENTORY)
    for host in settled_lab:
        groups = [g for g in ("container", "vm_passthrough", "vm_vgpu", "dra") if host in inventory.get(g, {}).get("hosts", [])]
        assert host in summaries, "no readiness report for %s: %s" % (host, sorted(summaries))
        assert groups and summaries[host]["workload_type"] == groups[0].replace("_", "-"), (host, groups, summaries[host])
        assert summaries[host]["ready"] is True, summaries[host]

    # ansible-runner kept the artifacts AWX stores with the job: events and the exit code.
    artifacts = run.config.artifact_dir
    assert os.path.isfile(os.path.join(artifacts, "rc"))
    assert os.listdir(os.path.join(artifacts, "job_events"))


def offered_vgpu_types(host):
    """The type names of the mdevs a lab host really has, as the sandbox device plugin reads them."""
    out = lab("ssh", host, "--", "for d in /sys/bus/mdev/devices/*/mdev_type; do echo \"TYPE<$(cat $d/name)>\"; done",
              check=True).stdout
    return sorted(set(re.findall(r"^TYPE<(.+)>$", out, re.M)))


def test_site_is_a_noop_on_prepared_hosts(site_run, settled_lab, kube_api):
    result, out = site_run
    assert result.rc == 0, out[-6000:]
    recap = out[out.index("PLAY RECAP"):]
    for host in settled_lab:
        line = re.search(r"^%s\s+:(.*)$" % re.escape(host), recap, re.M)
        assert line, "no PLAY RECAP line for %s" % host
        assert "failed=0" in line.group(1) and "unreachable=0" in line.group(1)
        assert "changed=0" in line.group(1), line.group(0)
        # The readiness table has the host, its type from the inventory groups, and READY yes.
        assert re.search(r"%s\s+(container|vm-passthrough|vm-vgpu|dra)\s+yes\b" % re.escape(host), out), out[-4000:]
    assert not re.search(r"TASK \[[^\]]*Reboot once[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: ", out)
    # Each host's plan, shown by its preflight before anything could change, was empty, and no boot phase found a
    # reason to reboot its plan had not.
    assert "did not foresee" not in out, out[out.find("did not foresee") - 3000:][:6000]
    for host in settled_lab:
        # Under the json result format (ansible-runner's events) or the yaml one.
        assert re.search(r'ok: \[%s\] =>\s*(\{\s*"msg": \[\s*"nothing to change"\s*\]|msg:\s*- nothing to change)'
                         % re.escape(host), out), (host, out[-4000:])
    # The cluster half ran against the API server: the lab's Nodes carry their workload labels.
    assert re.search(r"^localhost\s+:.*failed=0", recap, re.M), recap
    kubectl = [os.path.join(kube_api["bin_dir"], "kubectl"), "--kubeconfig", kube_api["kubeconfig"]]
    for host, wanted in (("lab-container", "container"), ("lab-passthrough", "vm-passthrough"),
                         ("lab-vgpu", "vm-vgpu"), ("lab-dra", "container")):
        label = run_cmd(kubectl + ["get", "node", host, "-o",
                                   "jsonpath={.metadata.labels.nvidia\\.com/gpu\\.workload\\.config}"], check=True)
        assert label.stdout.strip() == wanted, (host, label.stdout)
    # The KubeVirt CR permits what the lab's hosts really offer: the passthrough stand-in GPU (1234:11e8, which
    # the sandbox device plugin would name by its bare device ID) and every vGPU type lab-vgpu has mdevs of.
    phd = json.loads(run_cmd(kubectl + ["get", "kubevirt", "kubevirt", "-n", "kubevirt", "-o",
                                        "jsonpath={.spec.configuration.permittedHostDevices}"], check=True).stdout)
    assert {"pciVendorSelector": "1234:11E8", "resourceName": "nvidia.com/11e8",
            "externalResourceProvider": True} in phd["pciHostDevices"], phd
    types = offered_vgpu_types("lab-vgpu")
    assert types, "lab-vgpu has no mdev"
    for name in types:
        entry = {"mdevNameSelector": name, "resourceName": "nvidia.com/" + re.sub(r"[\t\n\f\r ]+", "_", name),
                 "externalResourceProvider": True}
        assert entry in phd.get("mediatedDevices", []), (entry, phd)
    summary = re.search(r"KubeVirt (\d+) PCI \+ (\d+) mediated entries", out)
    assert summary and int(summary.group(2)) >= len(types), out[-3000:]


def test_the_plan_of_the_prepared_lab_is_empty(site_run, settled_lab, kube_api, tmp_path):
    """playbooks/plan.yml on the lab the scenarios prepared (after site.yml's run, which changed nothing): every host
    it connects to reads "nothing to change" in the table and "empty" in the JSON, the host another tool prepares
    reads as managed elsewhere, and nothing changed. Given the kubeconfig it reads the cluster (nodes, Helm releases,
    the KubeVirt CR) and the cluster half's plan is empty too: no label, release or KubeVirt entry would change."""
    del site_run  # after it: the cluster half's run leaves the hosts as they were
    document = str(tmp_path / "plan.json")
    path = os.pathsep.join([kube_api["bin_dir"], os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    # The inventory site.yml ran with (AWX's JSON, whose dicts come key-sorted): the values a release was installed
    # with are text (the device plugin configs as YAML), and the same configs from the YAML inventory, keys in the
    # order written, are other text, which the plan rightly names as a change.
    inventory = os.path.join(private_data_dir(str(tmp_path), {}, {}), "inventory", "hosts")
    proc = run_cmd(["ansible-playbook", "playbooks/plan.yml", "-i", inventory,
                    "-e", "gpuops_plan_file=" + document, "-e", "gpuops_kubeconfig=" + kube_api["kubeconfig"]],
                   timeout=900, env={"PATH": path})
    assert proc.returncode == 0, proc.stdout[-6000:]
    out = proc.stdout
    assert "changed=0" in out and "Traceback" not in out, out[-3000:]
    with open(document, encoding="utf-8") as handle:
        document = json.load(handle)
    plans, cluster = document["hosts"], document["cluster"]
    for host in settled_lab:
        plan = plans[host]
        assert plan["empty"] is True and plan["reboot"]["required"] is False, (host, plan)
        assert plan["changes"] == [] and plan["refusals"] == [], (host, plan)
    assert plans["lab-h200"]["managed"] is False
    # The cluster half, read from the lab's API server: every node (lab-h200 too) labelled as the run left it, both
    # releases installed with the values they would get, the KubeVirt CR permitting what the hosts offer.
    assert cluster["read"] is True, cluster
    assert cluster["refusals"] == [] and cluster["changes"] == [] and cluster["empty"] is True, cluster
    assert sorted(n["name"] for n in cluster["nodes"]) == sorted(list(settled_lab) + ["lab-h200"]), cluster["nodes"]
    assert [n["changed"] for n in cluster["nodes"]] == [False] * len(cluster["nodes"]), cluster["nodes"]
    assert sorted((r["name"], r["action"]) for r in cluster["releases"]) == [
        ("dra-driver-nvidia-gpu", "unchanged"), ("gpu-operator", "unchanged")], cluster["releases"]
    assert {"pciVendorSelector": "1234:11E8", "resourceName": "nvidia.com/11e8",
            "externalResourceProvider": True} in cluster["kubevirt"]["pciHostDevices"], cluster["kubevirt"]
    # The table under the lab's yaml result format: a row a host, its plan under it, then the cluster's section.
    for host in settled_lab:
        assert re.search(r"^\s*%s\s+(container|vm-passthrough|vm-vgpu|dra)\s+no\n\s+- nothing to change$"
                         % re.escape(host), out, re.M), out[-4000:]
    assert re.search(r"\d+ GPU nodes: 0 refused, 0 would reboot, %d with nothing to change, 1 managed"
                     % len(settled_lab), " ".join(out.split())), out[-3000:]
    assert re.search(r"^\s*CLUSTER  read: what would change there\n\s+- nothing to change$", out, re.M), out[-4000:]


def test_site_shares_the_container_nodes_gpus(site_run, kube_api):
    """The main job's cluster carries GPU sharing on its two container nodes: lab-container (a lab VM) time-sliced
    four ways, lab-h200 (a node whose host another tool prepares: no play connects to it) with seven MIG instances
    of the operator's default configuration and its driver installed on the host. The real chart stored both in the
    ClusterPolicy and the device plugin's ConfigMap; lab-h200 reads as managed elsewhere in the readiness report.
    (What the real operator deploys for them is test_75's, and `make site`'s.)"""
    result, out = site_run
    assert result.rc == 0, out[-3000:]
    kubectl = [os.path.join(kube_api["bin_dir"], "kubectl"), "--kubeconfig", kube_api["kubeconfig"]]

    def labels(node):
        return json.loads(run_cmd(kubectl + ["get", "node", node, "-o", "json"], check=True).stdout)["metadata"]["labels"]

    h200, container = labels("lab-h200"), labels("lab-container")
    assert (h200.get("nvidia.com/gpu.workload.config"), h200.get("nvidia.com/mig.config"),
            h200.get("nvidia.com/gpu.deploy.driver")) == ("container", "all-1g.18gb", "false"), h200
    assert "nvidia.com/device-plugin.config" not in h200, h200
    assert container.get("nvidia.com/device-plugin.config") == "lab-four-way", container
    assert "nvidia.com/mig.config" not in container and container.get("nvidia.com/gpu.deploy.driver") != "false", container
    policy = json.loads(run_cmd(kubectl + ["get", "clusterpolicy", "-o", "json"], check=True).stdout)["items"]
    assert len(policy) == 1, policy
    spec = policy[0]["spec"]
    assert spec["mig"]["strategy"] == "single" and spec["driver"]["enabled"] is True, (spec["mig"], spec["driver"])
    config = spec["devicePlugin"]["config"]["name"]
    data = json.loads(run_cmd(kubectl + ["get", "configmap", config, "-n", "gpu-operator", "-o", "json"],
                              check=True).stdout)["data"]
    four_way = yaml.safe_load(data["lab-four-way"])
    assert four_way["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}], four_way
    recap = out[out.index("PLAY RECAP"):]
    line = re.search(r"^lab-h200\s+:(.*)$", recap, re.M)
    assert line and "unreachable=0" in line.group(1) and "failed=0" in line.group(1), recap
    # The table's rows as words (under the json result format each line is a quoted list item).
    words = " ".join(re.sub(r'"|,$', " ", out, flags=re.M).split())
    assert re.search(r"lab-h200 container - - - host managed elsewhere: 00:06\.0=nvidia \(driver: host 580\.159\.04\) "
                     r"MIG all-1g\.18gb", words), out[-4000:]
