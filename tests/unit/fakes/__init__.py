# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The unit tests' fakes and harnesses, in one place; test modules import from here, never from each other.

- sysfs_tree: fake host trees (sysfs, procfs, /dev, pci.ids) under a temporary directory, and ready-made hosts.
- sriov_kernel: FakeTree and FakeKernel, a small sysfs tree and the kernel's answer to sriov_numvfs writes.
- mdev_hosts: MdevKernel (mdev create/remove, vendor vGPU types) and the A100, L40S and mtty host builders.
- vfio_bind_host: VfioKernel, the kernel's answer to the sysfs writes of vfio binding; make_host and run for vfio_bind.
- vfio_kernel: FakeVfioKernel, the ioctls of /dev/vfio and /dev/iommu for the unit tests of the vfio probe.
- command_host: CommandHost, a root tree and a bin directory of fake commands for modules that run commands.
- module_harness: run a module's main() with given arguments, exit_json/fail_json raising instead of exiting.
- fake_kube: an in-memory stand-in for _kube.KubeApi and a stub API server for the real client.
- grub_files: /etc/default/grub texts for the tests of _cmdline and kernel_cmdline.
- role_fakes: fake commands, registry, Kubernetes and AWX servers for tests that run the roles on localhost.
"""
