# gpuops.sandbox: one entry point for the environment, the lab, the main job and every test.
#   make site    the main job: environment, lab, playbooks/site.yml on inventories/lab/
#   make test    the landing tier (lint, sanity, unit, the integration tier's landing part); .ci/run calls this
#   make test-full  every test: the landing tier and every deep slice (tests/integration/tiers.py)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# The interpreter the environment is built from (scripts/venv-python.sh says which and why); `make PY=...` overrides.
PY ?= $(shell scripts/venv-python.sh)
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
COLL_LINK := .build/collections/ansible_collections/gpuops/sandbox
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= 0
LAB := $(BIN)/python lab/gpulab.py
KUBE := $(BIN)/python lab/kubelab.py
OPERATOR := $(BIN)/python lab/operatorlab.py
# The GPU Operator's source beside the checkout (see ../shared/upstream/README): the lab runs the real operator.
OPERATOR_SOURCE := $(or $(GPUOPS_OPERATOR_SOURCE),$(CURDIR)/../shared/upstream/gpu-operator/source)
# The integration tests' own API server (tests/integration/conftest.py), apart from the main job's .lab/kube.
KUBE_TEST_STATE := $(or $(GPUOPS_KUBE_TEST_STATE),$(CURDIR)/.lab/kube-tests)
# ...and those of test sessions that ran beside another one (KUBE_TEST_STATE-<pid>).
KUBE_TEST_STATES = $(KUBE_TEST_STATE) $(wildcard $(KUBE_TEST_STATE)-*)

.PHONY: venv hostdeps lab lab-image lab-stop lab-status lab-reset kube kube-binaries kube-stop kube-status site operator operator-build test \
	test-full \
	checks checks-beside lint sanity unit integration \
	molecule bench bench-modules bench-hosts bench-cluster bench-guest validate build release test-cores docs galaxy-import clean

# Python keeps the bytecode of what it imports (under __pycache__, git-ignored) only when PYTHONDONTWRITEBYTECODE is
# unset. Some machines set it for every process: then every ansible-playbook, module and worker compiled ansible,
# jinja2 and the kubernetes client again, 40 % of the controller's CPU in a cluster.yml run (test_70's first test:
# 89 CPU-seconds with it set, 51 without, 2026-11-28). Every target here runs without it.
unexport PYTHONDONTWRITEBYTECODE

# One command creates the Python environment from nothing (re-run when requirements change). --no-compile: the
# `ansible` package alone has 15,000 Python files; pip compiled them all (34 s of CPU, 2026-11-27), where Python
# compiles the few a run imports when it first imports them (and keeps them, see above).
# The module payloads Ansible runs on the controller are zip files, whose sources Python compiles on every run:
# lab/guest_pycache.py, which the lab's guests use for the same reason, keeps their bytecode in $(VENV)/zip-pycache
# (test_70's first test: 51 CPU-seconds without it, 47 with it, 2026-11-28).
venv: $(VENV)/.stamp $(COLL_LINK) $(VENV)/.pycache-stamp
$(VENV)/.pycache-stamp: lab/guest_pycache.py $(VENV)/.stamp
	@purelib=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
		cp lab/guest_pycache.py "$$purelib/gpulab_pycache.py"; \
		echo "import gpulab_pycache; gpulab_pycache.install('$(CURDIR)/$(VENV)/zip-pycache')" >"$$purelib/gpulab-pycache.pth"
	touch $@
$(VENV)/.stamp: requirements/controller.txt requirements/dev.txt requirements/constraints.txt
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile \
		-r requirements/dev.txt -c requirements/constraints.txt
	touch $@
$(COLL_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../../.. $@

# Host packages the lab needs (QEMU, debootstrap, ...); installs them when run as root with apt.
hostdeps:
	scripts/hostdeps.sh

lab: venv hostdeps
	$(LAB) start
# The lab's disk image only (built once and cached); the tests boot the hosts they use.
lab-image: venv hostdeps
	$(LAB) image
lab-stop: venv
	$(LAB) stop
lab-status: venv
	$(LAB) status
lab-reset: venv
	$(LAB) reset

# The cluster lab: etcd + kube-apiserver on loopback with the project's fixtures (a healthy one is reused).
# kube-stop also stops the integration tests' server (left running by GPUOPS_KUBE_KEEP=1 or an interrupted run).
kube-binaries: venv hostdeps
	$(KUBE) build
kube: kube-binaries
	$(KUBE) start
	$(KUBE) fixtures
kube-stop: venv
	rc=0; $(OPERATOR) stop || rc=1; $(KUBE) stop || rc=1; \
	for state in $(KUBE_TEST_STATES); do GPUOPS_KUBE_STATE=$$state $(KUBE) stop || rc=1; done; exit $$rc
kube-status: venv
	$(KUBE) status

# The main job on the embedded default: the local lab (QEMU hosts and the API server), then the real GPU
# Operator reconciling what it installed, and playbooks/validate.yml waiting on the operator's labels.
# The lab (image build, boots), the Kubernetes build and the GPU Operator build do not depend on each other:
# they overlap (each prints what it is at while it runs; see GPUOPS_LAB_PROGRESS in the README).
site: venv hostdeps
	$(MAKE) -j3 --no-print-directory lab kube operator-build
	eval "$$($(KUBE) env)" && ansible-playbook playbooks/site.yml -i inventories/lab/ \
		-e gpuops_kubeconfig="$$K8S_AUTH_KUBECONFIG"
	$(MAKE) operator

# The real GPU Operator (lab/operatorlab.py: built once and cached, a running one reused) against the main
# job's API server, where site.yml installed its chart; nothing to do without its source beside the checkout.
operator-build: venv
	@if [ ! -d "$(OPERATOR_SOURCE)" ]; then exit 0; fi; $(OPERATOR) build
operator: venv
	@if [ ! -d "$(OPERATOR_SOURCE)" ]; then \
		echo "operator: no GPU Operator source at $(OPERATOR_SOURCE); the lab runs without the operator"; exit 0; fi; \
	$(OPERATOR) build && $(OPERATOR) start && \
	eval "$$($(KUBE) env)" && ansible-playbook playbooks/validate.yml -i inventories/lab/ \
		-e gpuops_kubeconfig="$$K8S_AUTH_KUBECONFIG"

# Every test. The quick tiers (lint, sanity, unit: one core, minutes) run beside the Kubernetes build, the lab
# image and then the integration tier, at nice 10 (below the tests' own Ansible; each lab host's QEMU runs in a
# session of its own and shares the CPU with them as a whole). Their output goes to .build/checks.log and is
# printed in one piece when they end; a failing tier fails the command once the others have ended.
# The integration tier runs its landing part and the deep slices SLICES names (comma-separated, `all` for every one;
# tests/integration/tiers.py says what each proves and costs): `make test SLICES=kernels`. .ci/run picks them
# (scripts/ci_slices.py).
ifndef SLICES
SLICES := $(GPUOPS_SLICES)
endif
export GPUOPS_SLICES := $(SLICES)
test: venv hostdeps
	$(MAKE) -j3 checks-beside integration
test-full:
	$(MAKE) test SLICES=all
checks-beside:
	@mkdir -p .build; rc=0; nice -n 10 $(MAKE) --no-print-directory checks >.build/checks.log 2>&1 || rc=$$?; \
		cat .build/checks.log; echo "checks: exit status $$rc"; exit $$rc
checks:
	$(MAKE) -j1 lint sanity unit

lint: venv
	yamllint -s .
	ansible-lint --profile production

sanity: venv
	scripts/run-sanity.sh

unit: venv
	pytest -q tests/unit

# The tests start their own API server from an empty store (not the main job's: `make site` leaves its
# labels, releases and KubeVirt settings there), so only the binaries are a prerequisite.
# Two pytest sessions at once (scripts/integration.sh): the main one with the lab's work and the API server's
# tests, and beside it the vGPU Manager image tests, which need neither, then the real charts, drain and operator
# tests on an API server of that session's own.
# At the end it says where the tier's CPU time went (scripts/cpu_share.py; also as JSON under .build/).
# When it ends it writes its own exit status and time to .build/integration.result (.ci/run records them).
integration: lab-image kube-binaries
	@mkdir -p .build; rm -f .build/integration.result; started=$$(date +%s); rc=0; \
	GPUOPS_KUBE_TEST_STATE=$(KUBE_TEST_STATE) $(BIN)/python scripts/cpu_share.py .build/cpu-share-integration.json -- \
		scripts/integration.sh || rc=$$?; \
	printf '{"rc": %d, "seconds": %d}\n' "$$rc" "$$(($$(date +%s) - started))" >.build/integration.result; exit $$rc

bench: venv hostdeps
	$(BIN)/python scripts/bench.py

# Wall time of each host module on a lab host, first run and no-op re-run, 1 and all stand-in devices.
bench-modules: venv hostdeps
	$(BIN)/python scripts/bench_modules.py

# Host preparation per workload type: reboots, tasks and wall time of the first converge and the no-op
# re-run, and the re-run against a facts-only play (three lab hosts at once).
bench-hosts: venv hostdeps
	$(BIN)/python scripts/bench_hosts.py

# Node labels and the KubeVirt allowlist for 1,000 Node objects on a private API server: the collection's
# modules against a naive per-node kubernetes.core.k8s loop (wall time and API requests).
bench-cluster: venv
	$(BIN)/python scripts/bench_cluster.py

# A real guest with the stand-in devices passed through on lab-modules (guest_attach_probe): the paused guest's
# time (QMP) and a full boot's (the host's kernel and a busybox initramfs), with KVM and under software emulation.
bench-guest: venv hostdeps
	$(BIN)/python scripts/bench_guest.py

# The validation playbook (operator state labels, GPU resources, a test VM) against the lab's API server.
validate: lab kube
	eval "$$($(KUBE) env)" && ansible-playbook playbooks/validate.yml -i inventories/lab/ \
		-e gpuops_kubeconfig="$$K8S_AUTH_KUBECONFIG"

build: venv
	mkdir -p .build/dist
	ansible-galaxy collection build --force --output-path .build/dist

# Cut a release (CONTRIBUTING.md): `make release VERSION=1.1.0` checks the changelog fragments and the plugins'
# version_added, sets galaxy.yml's version, releases the fragments into CHANGELOG.rst with antsibull-changelog and
# builds the tarball into .build/dist. It commits nothing.
release: venv
	scripts/release.sh "$(VERSION)"

# Sanity and the unit tier on each ansible-core meta/runtime.yml claims that runs on this Python (2.19; CORES="2.18"
# picks another), each in its own cached virtualenv under .build/cores/ (scripts/test-cores.sh). No lab.
test-cores: venv
	scripts/test-cores.sh $(CORES)

# The documentation site (antsibull-docs + Sphinx) into .build/docs/html, and galaxy-importer's verdict on
# the built collection; each in a virtualenv of its own under .build/. Both also run in `make integration`.
docs: venv
	scripts/build-docs.sh
galaxy-import: venv
	scripts/galaxy-import.sh

clean:
	-$(OPERATOR) stop
	-$(LAB) stop
	-$(KUBE) stop
	-for state in $(KUBE_TEST_STATES); do GPUOPS_KUBE_STATE=$$state $(KUBE) stop; done
	rm -rf .build .lab tests/output
