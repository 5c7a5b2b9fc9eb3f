# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The integration tier's shape (tests/integration/tiers.py) and CI's pick of deep slices (scripts/ci_slices.py)."""

import json
import os
import subprocess
import sys

import pytest

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
sys.path.insert(0, os.path.join(TOP, "scripts"))
import ci_slices  # noqa: E402  pylint: disable=wrong-import-position
import tiers  # noqa: E402  pylint: disable=wrong-import-position

SCRIPT = os.path.join(TOP, "scripts", "ci_slices.py")


def tracked():
    return subprocess.run(["git", "ls-files"], cwd=TOP, check=True, text=True, stdout=subprocess.PIPE).stdout.split()


# --- the declarations -------------------------------------------------------------------------

def test_every_slice_says_what_it_proves_what_it_covers_and_costs():
    files = tracked()
    for name, spec in tiers.SLICES.items():
        assert spec["claims"] and all(isinstance(claim, str) and claim for claim in spec["claims"]), name
        assert spec["core_seconds"] > 0 and spec["source"], name
        # A pattern that matches nothing (a file renamed away) would let a change slip past the forcing.
        for pattern in spec["paths"]:
            assert tiers.paths_match([pattern], files), "%s: %s matches no tracked file" % (name, pattern)


def test_every_lab_part_waits_for_a_declared_part_of_its_own_tier_or_the_landing_tier():
    for part in tiers.LAB_WORK:
        assert part.tier == tiers.LANDING or part.tier in tiers.SLICES, part
        if part.after is not None:
            before = tiers.PARTS[part.after]
            assert before.tier in (tiers.LANDING, part.tier), (part, before)
    assert len(tiers.PARTS) == len(tiers.LAB_WORK)


def test_every_molecule_scenario_is_declared_lab_work():
    scenarios = {name for name in os.listdir(os.path.join(TOP, "extensions", "molecule"))
                 if os.path.isfile(os.path.join(TOP, "extensions", "molecule", name, "molecule.yml"))}
    declared = {name.replace("scenario ", "") for name in tiers.PARTS}
    assert scenarios and scenarios <= declared, scenarios - declared


def test_a_deep_part_runs_only_with_its_slice_and_a_landing_part_always():
    assert tiers.part_runs("switch", [])
    assert tiers.part_runs("refused switch", [])
    assert not tiers.part_runs("drift", [])
    assert tiers.part_runs("drift", ["repairs"])
    assert not tiers.part_runs("kernel repair", ["repairs"])
    assert tiers.part_runs("kernel repair", ["kernels"])
    # The kernel entry needs lab-passthrough on systemd-boot: the uefi slice's, after the refused switch (and the
    # drift repair when repairs runs too).
    assert tiers.part_runs("kernel entry", ["uefi"]) and not tiers.part_runs("kernel entry", ["repairs"])


def test_a_slice_shapes_its_lab_hosts_over_the_given_settings():
    assert tiers.lab_settings([]) == {} and tiers.lab_settings(["kernels", "cluster"], {}) == {}
    assert tiers.lab_settings(["uefi"]) == {"lab-passthrough": {"gpulab_boot": "uefi"}}
    # What the session was given stays, for the other hosts and settings; the slice's own value wins, and the given
    # mapping is left as it was.
    given = {"lab-passthrough": {"gpulab_boot": "bios", "gpulab_iommu": True}, "lab-vgpu": {"gpulab_iommu": False}}
    assert tiers.lab_settings(["uefi"], given) == {"lab-passthrough": {"gpulab_boot": "uefi", "gpulab_iommu": True},
                                                   "lab-vgpu": {"gpulab_iommu": False}}
    assert given["lab-passthrough"]["gpulab_boot"] == "bios"
    # A bad given value is the lab's to name (lab/labconfig.py settings_overrides, tests/unit/lab/test_gpulab.py).


def test_slices_are_parsed_and_a_wrong_name_is_named():
    assert tiers.parse_slices("") == [] and tiers.parse_slices(" , ") == []
    assert tiers.parse_slices("all") == list(tiers.SLICES)
    assert tiers.parse_slices("cluster,kernels") == ["kernels", "cluster"]
    with pytest.raises(ValueError) as err:
        tiers.parse_slices("kernels,kernel")
    assert "no slice named kernel;" in str(err.value) and "kernels, repairs, cluster" in str(err.value)


def test_the_module_targets_are_found_by_directory_in_their_order():
    found, plain = tiers.module_targets_found(os.path.join(TOP, "tests", "integration", "targets"))
    assert found["before_reboot"] == ["kernel_cmdline"]
    assert found["after_reboot"][0] == "iommu_check" and found["after_reboot"][-1] == "host_lock"
    assert sorted(found["before_reboot"] + found["after_reboot"]) == sorted(
        os.listdir(os.path.join(TOP, "tests", "integration", "targets")))
    assert plain == ["host_lock"]


def target(root, name, aliases, tasks=True):
    path = root / name
    (path / "tasks").mkdir(parents=True)
    if tasks:
        (path / "tasks" / "main.yml").write_text("---\n- name: A task\n  ansible.builtin.ping:\n")
    (path / "aliases").write_text(aliases)


def test_a_new_target_directory_runs_in_its_place_and_a_broken_one_is_an_error(tmp_path):
    target(tmp_path, "b_module", "needs/root\ngpulab/after_reboot/20\n")
    target(tmp_path, "a_module", "# comment\ngpulab/after_reboot/30\ngpulab/plain_ssh\n")
    target(tmp_path, "c_module", "gpulab/before_reboot/5\n")
    found, plain = tiers.module_targets_found(str(tmp_path))
    assert found == {"before_reboot": ["c_module"], "after_reboot": ["b_module", "a_module"]} and plain == ["a_module"]
    target(tmp_path, "no_tasks", "gpulab/after_reboot/40\n", tasks=False)
    target(tmp_path, "no_place", "needs/root\n")
    with pytest.raises(ValueError) as err:
        tiers.module_targets_found(str(tmp_path))
    assert "no_tasks has no tasks/main.yml" in str(err.value)
    assert "no_place's aliases give it 0 places on lab-modules" in str(err.value)


# --- CI's pick ----------------------------------------------------------------------------------

def passed(*slices, rc=0, seconds=None, predicted=None):
    run = {"commit": "0" * 40, "slices": list(slices), "rc": rc}
    if seconds:
        run.update(seconds=seconds, predicted_seconds=predicted)
    return run


def one_slice_budget():
    """A budget in minutes that admits the landing tier with any one slice, never two."""
    quick = tiers.COSTS["checks"]["core_seconds"] + tiers.COSTS[tiers.LANDING]["core_seconds"]
    largest = max(spec["core_seconds"] for spec in tiers.SLICES.values())
    two = sorted(spec["core_seconds"] for spec in tiers.SLICES.values())[:2]
    assert sum(two) > largest + 0.1 * 60 * 2
    return (quick + largest) / 2.0 / 60 + 0.1


def test_the_rotation_goes_by_the_commit_count():
    names = list(tiers.SLICES)
    for count in range(6):
        chosen, lines = ci_slices.pick(count, [], [], cores=2, budget_minutes=one_slice_budget())
        assert chosen == [names[count % len(names)]]
        assert ("rotation: commit %d" % count) in dict((n, r) for n, _v, r in lines)[chosen[0]]
    # The same commit and record give the same slices.
    assert ci_slices.pick(7, ["lab/gpulab.py"], [], 2) == ci_slices.pick(7, ["lab/gpulab.py"], [], 2)


def test_a_changed_path_forces_its_slice_in():
    names = list(tiers.SLICES)
    count = names.index("kernels")  # kernels' turn: the change must put cluster before it
    chosen, lines = ci_slices.pick(count, ["roles/gpu_operator/tasks/main.yml"], [], cores=2, budget_minutes=1000)
    assert chosen == names
    reasons = {name: reason for name, verdict, reason in lines if verdict == "runs"}
    assert reasons["cluster"].startswith("changed: roles/gpu_operator/tasks/main.yml")
    assert reasons["kernels"].startswith("rotation:") and reasons["repairs"].startswith("room:")
    # With room for one slice only, the changed one takes it from the rotation's.
    chosen, _lines = ci_slices.pick(count, ["roles/gpu_operator/tasks/main.yml"], [], cores=2,
                                    budget_minutes=one_slice_budget())
    assert chosen == ["cluster"]


def test_the_budget_s_room_is_filled_from_the_rotation_s_slice_on():
    """With no record (a machine that lost it) and nothing changed, every slice the budget holds still runs."""
    names = list(tiers.SLICES)
    chosen, lines = ci_slices.pick(names.index("cluster"), [], [], cores=2, budget_minutes=1000)
    assert chosen == names
    assert [name for name, _verdict, _reason in lines] == ["cluster", "uefi", "kernels", "repairs"]
    assert all(verdict == "runs" for _name, verdict, _reason in lines)
    # Room for two: the rotation's slice and the next one after it, wrapping round.
    quick = tiers.COSTS["checks"]["core_seconds"] + tiers.COSTS[tiers.LANDING]["core_seconds"]
    pair = tiers.SLICES["uefi"]["core_seconds"] + tiers.SLICES["kernels"]["core_seconds"]
    budget = (quick + pair) / 2.0 / 60 + 0.01
    chosen, lines = ci_slices.pick(names.index("uefi"), [], [], cores=2, budget_minutes=budget)
    assert chosen == ["kernels", "uefi"], lines
    verdicts = {name: verdict for name, verdict, _reason in lines}
    assert verdicts["repairs"] == verdicts["cluster"] == "left out"


def test_a_slice_left_out_of_two_passed_runs_is_overdue():
    count = list(tiers.SLICES).index("kernels")
    history = [passed("cluster", "uefi"), passed("repairs"), passed("kernels", rc=2), passed("repairs")]
    chosen, lines = ci_slices.pick(count, [], history, cores=2, budget_minutes=1000)
    verdicts = {name: (verdict, reason) for name, verdict, reason in lines}
    # kernels (its turn anyway) has not passed in the last three passed runs, cluster and uefi not in the last two:
    # overdue (the failed run counts not), and first, the longest overdue first; repairs fills the room.
    assert chosen == list(tiers.SLICES), lines
    assert [name for name, _verdict, _reason in lines] == ["kernels", "cluster", "uefi", "repairs"]
    assert verdicts["kernels"][1].startswith("overdue: not in the last 3 passed runs")
    assert verdicts["cluster"][1].startswith("overdue: not in the last 2 passed runs")
    assert verdicts["repairs"][1].startswith("room:")


def test_the_longest_overdue_slice_goes_first_when_the_budget_admits_one():
    budget = one_slice_budget()
    # uefi never passed here (four runs), repairs not in the last three, cluster not in the last two: uefi first,
    # though it comes last in the slices' order.
    history = [passed("repairs"), passed("cluster"), passed("kernels"), passed("kernels")]
    count = list(tiers.SLICES).index("kernels")
    chosen, lines = ci_slices.pick(count, [], history, cores=2, budget_minutes=budget)
    verdicts = {name: (verdict, reason) for name, verdict, reason in lines}
    assert chosen == ["uefi"], lines
    assert verdicts["cluster"][0] == "left out" and verdicts["repairs"][0] == "left out"
    assert verdicts["uefi"][1].startswith("overdue: not in the last 4 passed runs")
    # Once uefi passed, repairs is the longest overdue.
    chosen, _lines = ci_slices.pick(count, [], history + [passed("uefi")], cores=2, budget_minutes=budget)
    assert chosen == ["repairs"]


def test_a_slice_is_left_out_when_the_run_would_pass_the_budget():
    quick = tiers.COSTS["checks"]["core_seconds"] + tiers.COSTS[tiers.LANDING]["core_seconds"]
    cluster = tiers.SLICES["cluster"]["core_seconds"]
    # A budget that holds the landing tier and nothing more: the rotation's slice is left out, and says why.
    budget = (quick / 2.0 + 1) / 60
    count = list(tiers.SLICES).index("cluster")
    chosen, lines = ci_slices.pick(count, [], [], cores=2, budget_minutes=budget)
    assert chosen == []
    verdict = {name: (v, r) for name, v, r in lines}["cluster"]
    assert verdict[0] == "left out" and "past the" in verdict[1]
    # With room for it, it runs.
    chosen, _lines = ci_slices.pick(count, [], [], cores=2, budget_minutes=(quick + cluster) / 2.0 / 60 + 0.1)
    assert chosen == ["cluster"]


def test_the_last_passed_runs_time_scales_the_prediction():
    assert ci_slices.scale_of([]) == 1.0
    assert ci_slices.scale_of([passed(seconds=1200, predicted=1000)]) == pytest.approx(1.2)
    # Bounded: one odd run does not shut every slice out.
    assert ci_slices.scale_of([passed(seconds=9000, predicted=1000)]) == ci_slices.SCALE_LIMITS[1]
    count = list(tiers.SLICES).index("cluster")
    quick = tiers.COSTS["checks"]["core_seconds"] + tiers.COSTS[tiers.LANDING]["core_seconds"]
    budget = (quick + tiers.SLICES["cluster"]["core_seconds"]) / 2.0 / 60 + 0.1
    assert ci_slices.pick(count, [], [], 2, budget)[0] == ["cluster"]
    # A run 30 % slower than today's costs predict for it scales the next prediction up by as much.
    slower = round(ci_slices.predicted_seconds([], 2) * 1.3)
    assert ci_slices.pick(count, [], [passed(seconds=slower, predicted=1000)], 2, budget)[0] == []


def test_the_scale_compares_with_todays_costs_so_a_refit_is_not_corrected_twice():
    """A run recorded with the prediction of costs refitted since is compared with what today's costs predict."""
    today = ci_slices.predicted_seconds(["cluster"], 2)
    run = passed("cluster", seconds=round(today * 1.1), predicted=round(today * 2))
    assert ci_slices.scale_of([run]) == ci_slices.SCALE_LIMITS[0]  # the stored prediction: 0.55, bounded
    assert ci_slices.scale_of([run], cores=2) == pytest.approx(1.1, abs=0.01)
    # A run of a slice no longer declared keeps its stored prediction.
    gone = passed("retired", seconds=1200, predicted=1000)
    assert ci_slices.scale_of([gone], cores=2) == pytest.approx(1.2)


def test_a_run_whose_integration_tier_passed_counts_for_its_slices_and_the_scale():
    # The unit tier failed beside it (rc 2), the integration tier with the kernels slice passed: its time scales the
    # prediction and kernels passed in it.
    beside = dict(passed("kernels", rc=2, seconds=2600, predicted=3350), integration_rc=0)
    assert ci_slices.scale_of([beside]) == pytest.approx(max(2600 / 3350.0, ci_slices.SCALE_LIMITS[0]))
    assert ci_slices.scale_of([dict(beside, integration_rc=1)]) == 1.0
    count = list(tiers.SLICES).index("kernels")
    history = [beside, dict(passed("kernels", rc=2), integration_rc=0)]
    chosen, lines = ci_slices.pick(count, [], history, cores=2, budget_minutes=1000)
    verdicts = {name: reason for name, _verdict, reason in lines}
    assert "cluster" in chosen and verdicts["cluster"].startswith("overdue: not in the last 2 passed runs")
    assert not ci_slices.integration_passed(dict(passed("kernels", rc=2), integration_rc=2))


def test_the_record_keeps_the_integration_tiers_own_status(tmp_path):
    state, result = tmp_path / "history.json", tmp_path / "integration.result"
    result.write_text('{"rc": 0, "seconds": 2500}\n')
    command = [sys.executable, SCRIPT, "--state", str(state), "--cores", "2", "record", "--slices", "kernels",
               "--rc", "2", "--seconds", "2600", "--integration-result", str(result)]
    done = subprocess.run(command, cwd=TOP, check=False, text=True, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run = json.loads(state.read_text())["runs"][-1]
    assert (run["rc"], run["integration_rc"], run["integration_seconds"]) == (2, 0, 2500)
    # The tier never ran (no file): the run's status alone. A damaged file is said, not a traceback.
    result.unlink()
    subprocess.run(command, cwd=TOP, check=True, text=True, capture_output=True, timeout=60)
    assert "integration_rc" not in json.loads(state.read_text())["runs"][-1]
    result.write_text("{broken")
    done = subprocess.run(command, cwd=TOP, check=False, text=True, capture_output=True, timeout=60)
    assert done.returncode == 0 and "integration result" in done.stderr and "Traceback" not in done.stderr
    assert "integration_rc" not in json.loads(state.read_text())["runs"][-1]


def test_the_command_picks_for_head_and_records_the_run(tmp_path):
    state = tmp_path / "history.json"
    env = dict(os.environ, GPUOPS_CI_BUDGET_MINUTES="1000")
    picked = subprocess.run([sys.executable, SCRIPT, "--state", str(state), "--cores", "2", "pick"], cwd=TOP, env=env,
                            check=False, text=True, capture_output=True, timeout=60)
    assert picked.returncode == 0, picked.stderr
    chosen = picked.stdout.strip()
    assert chosen and tiers.parse_slices(chosen), picked.stdout
    assert "ci_slices: HEAD " in picked.stderr
    for name in tiers.SLICES:
        assert "ci_slices:   %s " % name in picked.stderr, picked.stderr
    done = subprocess.run([sys.executable, SCRIPT, "--state", str(state), "--cores", "2", "record", "--slices", chosen,
                           "--rc", "0", "--seconds", "3000"], cwd=TOP, check=False, text=True, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    runs = json.loads(state.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["rc"] == 0 and runs[0]["slices"] == tiers.parse_slices(chosen)
    assert runs[0]["predicted_seconds"] > 0 and len(runs[0]["commit"]) == 40
    # A damaged record is said and set aside; the pick goes by the commit alone.
    state.write_text("{not json")
    picked = subprocess.run([sys.executable, SCRIPT, "--state", str(state), "pick"], cwd=TOP, env=env, check=False,
                            text=True, capture_output=True, timeout=60)
    assert picked.returncode == 0 and "is unreadable" in picked.stderr and "Traceback" not in picked.stderr
    bad = subprocess.run([sys.executable, SCRIPT, "--state", str(state), "record", "--slices", "kernel", "--rc", "0",
                          "--seconds", "1"], cwd=TOP, check=False, text=True, capture_output=True, timeout=60)
    assert bad.returncode == 2 and "no slice named kernel" in bad.stderr and "Traceback" not in bad.stderr


def test_the_landings_the_tree_keeps_come_before_the_machines_record():
    machine = [passed("kernels"), dict(passed("cluster"), commit="b" * 40)]
    landings = [dict(passed("uefi"), commit="a" * 40), passed("repairs")]  # the second is the machine's first run too
    merged = ci_slices.merged_history(landings, machine)
    assert [run["slices"] for run in merged] == [["uefi"], ["kernels"], ["cluster"]]
    assert ci_slices.merged_history([], machine) == machine and ci_slices.merged_history(landings, []) == landings


def test_a_new_machine_finds_the_overdue_slices_in_the_landings_the_tree_keeps(tmp_path):
    """The machine's record is empty (a new machine); the tree's landings ran every slice but cluster in the last
    two, so cluster is overdue."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=TOP, check=True, text=True, capture_output=True).stdout.strip()
    others = [name for name in tiers.SLICES if name != "cluster"]
    landings = tmp_path / "landings.json"
    landings.write_text(json.dumps({"runs": [{"commit": head, "slices": others[:1], "rc": 0, "seconds": 2000},
                                             {"commit": head, "slices": others[1:], "rc": 0, "seconds": 2000}]}))
    env = dict(os.environ, GPUOPS_CI_BUDGET_MINUTES="1000")
    picked = subprocess.run([sys.executable, SCRIPT, "--state", str(tmp_path / "none.json"), "--landings", str(landings),
                             "--cores", "2", "pick"], cwd=TOP, env=env, check=False, text=True, capture_output=True,
                            timeout=60)
    assert picked.returncode == 0, picked.stderr
    assert "ci_slices:   cluster  runs       overdue: not in the last 2 passed runs on record" in picked.stderr
    # The tree's own file is well-formed, and holds landings of this history.
    kept = ci_slices.read_history(ci_slices.LANDINGS)
    assert kept and all(len(run["commit"]) == 40 and tiers.parse_slices(",".join(run["slices"])) == run["slices"]
                        for run in kept)


def test_the_testing_guide_names_every_slice_and_how_a_target_is_found():
    with open(os.path.join(TOP, "docs", "docsite", "rst", "guide_testing.rst"), encoding="utf-8") as handle:
        guide = handle.read()
    for name in tiers.SLICES:
        assert "   * - ``%s``" % name in guide, name
    assert "gpulab/before_reboot/<order>" in guide and "gpulab/after_reboot/<order>" in guide
    assert "%d minutes by default" % ci_slices.BUDGET_MINUTES in guide


def make_database(*args):
    """The value make gives GPUOPS_SLICES with the command-line ``args``, read through a target of the test's own
    (``make -pn test`` would run the recipes' $(MAKE) lines, and checks-beside's redirection would overwrite the
    running checks' .build/checks.log)."""
    # A run under make (CI's `make test SLICES=...` runs this tier) exports its command-line variables and flags;
    # the value is read as a fresh shell would see it.
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLICES", "GPUOPS_SLICES", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL")}
    done = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                           "print-slices: ; @echo 'GPUOPS_SLICES := $(GPUOPS_SLICES)'", "print-slices"] + list(args),
                          cwd=TOP, env=env, check=False, text=True, capture_output=True, timeout=120)
    return [line for line in done.stdout.splitlines() if line.startswith("GPUOPS_SLICES :=")]


def test_make_passes_the_slices_to_the_integration_tier():
    assert set(make_database()) == {"GPUOPS_SLICES := "}
    assert set(make_database("SLICES=kernels,cluster")) == {"GPUOPS_SLICES := kernels,cluster"}
    # test-full asks for every slice (its recipe), and .ci/run passes its pick as SLICES.
    with open(os.path.join(TOP, "Makefile"), encoding="utf-8") as handle:
        makefile = handle.read()
    assert "test-full:\n\t$(MAKE) test SLICES=all\n" in makefile
    with open(os.path.join(TOP, ".ci", "run"), encoding="utf-8") as handle:
        ci = handle.read()
    assert 'slices=$(python3 scripts/ci_slices.py pick)' in ci and 'make test SLICES="$slices"' in ci
