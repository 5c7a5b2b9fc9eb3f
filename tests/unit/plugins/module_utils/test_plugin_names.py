# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The sandbox device plugin's resource names: table, port and a differential test against Go.

The checks against the plugin's real pci.ids and the GPU Operator's values.yaml read them from
``../shared/upstream/`` beside the checkout and are skipped without it. The differential tests build
go_plugin_names/main.go (the project's own oracle, standard library only) and skip without ``go``.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import unicodedata

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils import _pci
from ansible_collections.gpuops.sandbox.plugins.module_utils import _plugin_names as pn

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
UPSTREAM = os.path.join(os.path.dirname(TOP), "shared", "upstream")
PLUGIN_PCI_IDS = os.path.join(UPSTREAM, "kubevirt-gpu-device-plugin", "pci.ids")
OPERATOR_VALUES = os.path.join(UPSTREAM, "gpu-operator", "values.yaml")
ORACLE_SOURCE = os.path.join(HERE, "go_plugin_names", "main.go")

needs_upstream = pytest.mark.skipif(
    not (os.path.isfile(PLUGIN_PCI_IDS) and os.path.isfile(OPERATOR_VALUES)),
    reason="../shared/upstream (the plugin's pci.ids, the operator's values.yaml) is absent: check skipped")


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _sfx(name):
    return name.encode("utf-8", "surrogateescape")


@pytest.fixture(scope="module")
def plugin_pci_ids():
    if not os.path.isfile(PLUGIN_PCI_IDS):
        pytest.skip("../shared/upstream is absent: the plugin's pci.ids is not available")
    return _read(PLUGIN_PCI_IDS)


@pytest.fixture(scope="module")
def nvidia_ids(plugin_pci_ids):
    """The NVIDIA device IDs of the plugin's pci.ids, read with the collection's own pci.ids parser."""
    db = _pci.parse_pci_ids(plugin_pci_ids.decode("utf-8"))
    return sorted(db["vendors"]["10de"]["devices"])


# --- the table --------------------------------------------------------------------------------

@pytest.mark.parametrize("device_id, expected", [
    ("2330", "nvidia.com/GH100_H100_SXM5_80GB"),
    ("26b9", "nvidia.com/AD102GL_L40S"),
    ("2236", "nvidia.com/GA102GL_A10"),
    ("0x26B9", "nvidia.com/AD102GL_L40S"),
    ("20b5", "nvidia.com/GA100_A100_PCIE_80GB"),
    ("ffff", "nvidia.com/ffff"),
])
def test_table_spot_checks(device_id, expected):
    assert pn.passthrough_resource_name(device_id) == expected
    assert _pci.sandbox_resource_name(None, device_id) == expected


def test_table_is_sorted_and_well_formed():
    ids = list(pn.PASSTHROUGH_RESOURCE_NAMES)
    assert ids == sorted(ids) and len(ids) > 1000
    assert all(len(i) == 4 and set(i) <= set("0123456789abcdef") for i in ids)
    assert all(v.startswith("nvidia.com/") and len(v) > len("nvidia.com/") for v in pn.PASSTHROUGH_RESOURCE_NAMES.values())
    assert pn.PCI_IDS_VERSION == "2025.07.11"
    assert pn.PLUGIN_IMAGE == "nvcr.io/nvidia/kubevirt-gpu-device-plugin"


@needs_upstream
def test_table_equals_the_port_on_the_plugin_pci_ids(plugin_pci_ids, nvidia_ids):
    assert list(pn.PASSTHROUGH_RESOURCE_NAMES) == nvidia_ids
    names = pn.plugin_device_names(plugin_pci_ids, nvidia_ids)
    for device_id in nvidia_ids:
        assert pn.PASSTHROUGH_RESOURCE_NAMES[device_id] == "nvidia.com/" + (names[device_id] or device_id), device_id
    for device_id in ("2330", "26b9", "2236", "ffff"):
        assert pn.passthrough_resource_name(device_id, pci_ids=plugin_pci_ids) == pn.passthrough_resource_name(device_id)


@needs_upstream
def test_table_records_the_versions_it_was_made_from(plugin_pci_ids):
    assert b"#\tVersion: %s\n" % pn.PCI_IDS_VERSION.encode() in plugin_pci_ids[:200]
    values = yaml.safe_load(_read(OPERATOR_VALUES).decode("utf-8"))["sandboxDevicePlugin"]
    assert pn.PLUGIN_IMAGE_VERSION == values["version"]
    assert pn.PLUGIN_IMAGE == "%s/%s" % (values["repository"], values["image"])


@needs_upstream
def test_generated_section_is_up_to_date(capsys):
    spec = importlib.util.spec_from_file_location("gen_plugin_names", os.path.join(TOP, "scripts", "gen-plugin-names.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main([PLUGIN_PCI_IDS, OPERATOR_VALUES, "--check"]) == 0, capsys.readouterr().out


@needs_upstream
def test_table_lookup_of_mdev_keys_equals_the_port(plugin_pci_ids):
    """mdev keys are looked up like device IDs; the table answers them as the file would."""
    hexd = "0123456789abcdef"
    keys = ["", "2330", "2330x", "26b9_", "NVIDIA_A10-12Q", "GRID_T4-1Q", "Single_port_serial", "A", "0x2330"]
    keys += list(hexd) + [a + b for a in hexd for b in hexd] + ["%03x" % n for n in range(0, 0x1000, 7)]
    names = pn.plugin_device_names(plugin_pci_ids, keys)
    for key in keys:
        assert pn.vgpu_resource_name(key) == "nvidia.com/" + (names[key] or key), key
    assert pn.vgpu_resource_name("2330", plugin_pci_ids) == pn.vgpu_resource_name("2330")


def test_host_pci_ids_names_differ_from_the_plugin():
    """Debian 12's pci.ids (2023.04.10) has no blank in the H100 name and no L40S: wrong names."""
    debian = "10de  NVIDIA Corporation\n\t2330  GH100[H100 SXM5 80GB]\n"
    assert _pci.sandbox_resource_name(debian, "2330") == "nvidia.com/GH100H100_SXM5_80GB"
    assert _pci.sandbox_resource_name(debian, "26b9") == "nvidia.com/26b9"
    assert pn.passthrough_resource_name("2330", pci_ids=debian) == "nvidia.com/GH100H100_SXM5_80GB"
    assert pn.passthrough_resource_name("2330") == "nvidia.com/GH100_H100_SXM5_80GB"
    assert pn.passthrough_resource_name("26b9") == "nvidia.com/AD102GL_L40S"


# --- overrides and errors ---------------------------------------------------------------------

@pytest.mark.parametrize("overrides, device_id, expected", [
    ({"10de:2330": "nvidia.com/H100"}, "2330", "nvidia.com/H100"),
    ({"2330": "nvidia.com/H100"}, "0x2330", "nvidia.com/H100"),
    ({" 10DE:0x2330 ": "example.org/h100.sxm"}, "2330", "example.org/h100.sxm"),
    ({"2330": "nvidia.com/H100", "10de:2330": "nvidia.com/H100"}, "2330", "nvidia.com/H100"),
    ({"26b9": "nvidia.com/L40S"}, "2330", "nvidia.com/GH100_H100_SXM5_80GB"),
    ({}, "2330", "nvidia.com/GH100_H100_SXM5_80GB"),
    (None, "abcd", "nvidia.com/abcd"),
])
def test_overrides_win(overrides, device_id, expected):
    assert pn.passthrough_resource_name(device_id, overrides=overrides) == expected


def test_overrides_win_over_a_given_pci_ids():
    text = "10de  NVIDIA\n\t2330  Some Name\n"
    assert pn.passthrough_resource_name("2330", pci_ids=text) == "nvidia.com/SOME_NAME"
    assert pn.passthrough_resource_name("2330", {"2330": "nvidia.com/X"}, text) == "nvidia.com/X"
    assert pn.passthrough_resource_name("26b9", pci_ids=text) == "nvidia.com/26b9"
    assert pn.parse_overrides({"10DE:2330": "nvidia.com/X"}) == {"2330": "nvidia.com/X"}


@pytest.mark.parametrize("overrides, message", [
    ({"1002:2330": "nvidia.com/X"}, "resource name override key '1002:2330' names vendor 1002; the sandbox device "
                                    "plugin only names NVIDIA (10de) devices"),
    ({"233": "nvidia.com/X"}, "resource name override key '233' is not valid; expected a device ID as 10de:DDDD or "
                              "DDDD (4 hex digits), e.g. 10de:2330"),
    ({2330: "nvidia.com/X"}, "resource name override key 2330 is not valid"),
    ({"10de-2330": "nvidia.com/X"}, "resource name override key '10de-2330' is not valid"),
    ({"2330": "H100"}, "resource name override 'H100' for '2330' is not valid; expected a Kubernetes extended "
                       "resource name DOMAIN/NAME"),
    ({"2330": "nvidia.com/"}, "resource name override 'nvidia.com/' for '2330' is not valid"),
    ({"2330": "nvidia.com/H100 SXM"}, "resource name override 'nvidia.com/H100 SXM' for '2330' is not valid"),
    ({"2330": "nvidia.com/H100_"}, "resource name override 'nvidia.com/H100_' for '2330' is not valid"),
    ({"2330": "nvidia.com/" + "A" * 64}, "resource name override 'nvidia.com/AAAA"),
    ({"2330": "NVIDIA.com/H100"}, "resource name override 'NVIDIA.com/H100' for '2330' is not valid"),
    ({"2330": "kubernetes.io/h100"}, "resource name override 'kubernetes.io/h100' for '2330' is not valid"),
    ({"2330": "a/b/c"}, "resource name override 'a/b/c' for '2330' is not valid"),
    ({"2330": None}, "resource name override None for '2330' is not valid"),
    ({"2330": "nvidia.com/A", "10de:2330": "nvidia.com/B"},
     "resource name overrides give device 2330 two names: 'nvidia.com/A' and 'nvidia.com/B'"),
    (["10de:2330=nvidia.com/A"], "resource name overrides must be a mapping of device ID to resource name"),
])
def test_bad_overrides_name_the_value(overrides, message):
    with pytest.raises(pn.PluginNameError) as info:
        pn.passthrough_resource_name("2330", overrides=overrides)
    assert isinstance(info.value, ValueError)
    assert info.value.msg.startswith(message)
    assert str(info.value) == info.value.msg


@pytest.mark.parametrize("device_id", ["", "22", "22366", "zzzz", "10de:2330", None, 2330])
def test_bad_device_id(device_id):
    with pytest.raises(pn.PluginNameError) as info:
        pn.passthrough_resource_name(device_id)
    assert info.value.msg == "device ID %r is not valid; expected 4 hex digits, e.g. 2236" % (device_id,)


@pytest.mark.parametrize("func, args", [
    (pn.plugin_device_name, (None, "2330")),
    (pn.plugin_device_name, ("", 2330)),
    (pn.vgpu_resource_name, (None,)),
    (pn.vendor_vgpu_resource_names, (None,)),
    (pn.vgpu_profile_resource_name, (None,)),
])
def test_inputs_must_be_text_or_bytes(func, args):
    with pytest.raises(pn.PluginNameError) as info:
        func(*args)
    assert "must be text or bytes, not" in info.value.msg


# --- the port on hand-made input --------------------------------------------------------------

NVIDIA_BLOCK = "10de  NVIDIA Corporation\n"


@pytest.mark.parametrize("line, expected", [
    ("\t2236  GA102GL [A10]", "GA102GL_A10"),
    ("\t2236  GA102/GL. x  [A10]*", "GA102_GL__X_A10"),
    ("\t2236  A100+ (rev a1)", "A100_REV_A1"),
    ("\t2236  straße", "STRAE"),  # Go keeps ß (no single-rune upper case), then drops it; Python would give SS
    ("\t2236  ﬀ ıx ſ", "_IX_S"),  # ligature kept then dropped; ı and ſ upper-case to ASCII
    ("\t2236  a\u00a0b", "AB"),  # NBSP: trimmed at the ends by TrimSpace, not \s inside
    ("\t2236  a\x85b", "AB"),  # NEL: same, and not a line break
    ("\t2236  a\vb", "AB"),  # \v is not RE2's \s
    ("\t2236  a\fb", "A_B"),
    ("\t2236  \x1c a", "_A"),  # \x1c is white space to Python, not to Go
    ("\t2236  \u3000a\u2003 ", "A"),
    ("\t2236", ""),
    ("\t2236  []", ""),
    ("\t22366  x", "6_X"),
])
def test_port_names(line, expected):
    assert pn.plugin_device_name(NVIDIA_BLOCK + line + "\n", "2236") == expected


def test_port_scanning_rules():
    assert pn.plugin_device_name("10de0  Other\n\t2330  Wrong\n10de  NVIDIA\n\t2330  Right\n", "2330") == "WRONG"
    assert pn.plugin_device_name("8086  Intel\n\t2330  SMBus\n10de  NVIDIA\n\t2330  GH100\n", "2330") == "GH100"
    assert pn.plugin_device_name(NVIDIA_BLOCK + "# c\n\t\t10de 2330  Sub\n\t2330  Dev\n", "2330") == "DEV"
    assert pn.plugin_device_name(NVIDIA_BLOCK + "\n\t2330  After a blank line\n", "2330") == ""
    assert pn.plugin_device_name(NVIDIA_BLOCK + " # indented comment\n\t2330  x\n", "2330") == ""
    assert pn.plugin_device_name(NVIDIA_BLOCK.replace("\n", "\r\n") + "\t2330  a b\r\n", "2330") == "A_B"
    assert pn.plugin_device_name(NVIDIA_BLOCK + "\t2330  a\r\r\n", "2330") == "A"
    assert pn.plugin_device_name(NVIDIA_BLOCK + "\t2330  no newline", "2330") == "NO_NEWLINE"
    assert pn.plugin_device_name(NVIDIA_BLOCK + "\t00AB  upper\n", "00ab") == ""
    assert pn.plugin_device_name("10DE  upper vendor\n\t2330  x\n", "2330") == ""
    assert pn.plugin_device_name(b"10de  N\n\t2330  A\xffB\xe2\x82 C\n", "2330") == "AB_C"


@pytest.mark.parametrize("pad, found", [(65535 - 3, True), (65536 - 3, False)])
def test_port_stops_at_a_64k_line(pad, found):
    long_line = "#  " + "x" * pad  # 65535 bytes is the longest line bufio.Scanner returns
    assert len(long_line) in (65535, 65536)
    text = NVIDIA_BLOCK + long_line + "\n\t2330  GH100\n"
    assert pn.plugin_device_name(text, "2330") == ("GH100" if found else "")
    assert pn.plugin_device_name(NVIDIA_BLOCK + "\t2330  GH100\n" + long_line, "2330") == "GH100"


def test_unscoped_port():
    text = "1111  Vendor\n\t2236 2236  Twice\n10de  NVIDIA Corporation\n\t2236  GA102GL [A10]\n"
    assert pn.plugin_device_name(text, "2236", vendor_scoped=False) == ""
    assert _pci.sandbox_resource_name(text, "2236", vendor_scoped=False) == "nvidia.com/2236"
    text = "8086  Intel\n\t2330  DH89xxCC SMBus Controller\n10de  NVIDIA\n\t2330  GH100\n"
    assert pn.plugin_device_name(text, "2330", vendor_scoped=False) == "DH89XXCC_SMBUS_CONTROLLER"
    with pytest.raises(_pci.SelectorError):
        _pci.sandbox_resource_name(None, "2330", vendor_scoped=False)


@pytest.mark.parametrize("raw, expected", [
    (b"NVIDIA A10-12Q\n", "nvidia.com/NVIDIA_A10-12Q"),
    (b"NVIDIA A10-12Q \n", "nvidia.com/NVIDIA_A10-12Q_"),
    ("NVIDIA\tA10-12Q", "nvidia.com/NVIDIA_A10-12Q"),
    ("NVIDIA\vA10-12Q\n", "nvidia.com/NVIDIA\vA10-12Q"),
    ("\n\nNVIDIA  A100-4C\n\n", "nvidia.com/NVIDIA_A100-4C"),
    ("NVIDIA A10\r\n", "nvidia.com/NVIDIA_A10_"),
    ("GRID T4-1Q", "nvidia.com/GRID_T4-1Q"),
    ("2330\n", "nvidia.com/GH100_H100_SXM5_80GB"),  # looked up like a device ID, as the plugin does
    ("\n", "nvidia.com/0008_NV1_STG2000XB_SERIES"),  # the empty key matches the first NVIDIA device
])
def test_vgpu_resource_names(raw, expected):
    assert pn.vgpu_resource_name(raw) == expected
    assert _pci.vgpu_resource_name(raw) == expected


def test_vendor_vgpu_resource_names():
    content = "GPU Type ID : vGPU Name\n1428 : NVIDIA H200X-141C\n 12 :NVIDIA  L40S-8Q \r\n12 : other\n"
    assert pn.vendor_vgpu_resource_names(content) == {
        "1428": "nvidia.com/NVIDIA_H200X-141C", "12": "nvidia.com/NVIDIA_L40S-8Q"}
    assert pn.vendor_vgpu_resource_name(content, "12\n") == "nvidia.com/NVIDIA_L40S-8Q"
    assert pn.vendor_vgpu_resource_name(content, "0\n") is None
    assert pn.vendor_vgpu_resource_name(content, "") is None
    assert pn.vendor_vgpu_resource_name(content, "13") is None
    assert pn.vendor_vgpu_resource_names("\u00a012 : a\u00a0") == {"12": "nvidia.com/a"}
    assert pn.vendor_vgpu_resource_names("1 : a\u00a0\n2 : b\u00a0") == {"1": "nvidia.com/a\u00a0", "2": "nvidia.com/b"}
    assert pn.vendor_vgpu_resource_names("1 : a\vb\v\n2 : c\v") == {"1": "nvidia.com/a\vb\v", "2": "nvidia.com/c"}
    assert pn.vendor_vgpu_resource_names("x : a\n1 :\n") == {}
    assert pn.vgpu_profile_resource_name("NVIDIA L40S-8Q") == "nvidia.com/NVIDIA_L40S-8Q"
    assert pn.vgpu_profile_resource_name("NVIDIA \t L40S\v8Q") == "nvidia.com/NVIDIA_L40S\v8Q"


# --- Go's own semantics -----------------------------------------------------------------------

class Oracle:
    """The Go oracle, one process for the whole module: one JSON request and response per line."""

    def __init__(self, binary):
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        response = json.loads(self.proc.stdout.readline())
        assert not response.get("error"), response
        return response

    def load(self, text_id, text):
        self.ask(op="load", id=text_id, text=base64.b64encode(text).decode())

    def results(self, op, keys, text_id=""):
        encoded = [base64.b64encode(k).decode() for k in keys]
        response = self.ask(op=op, text_id=text_id, keys=encoded)
        return [base64.b64decode(r) for r in response.get("results", [])]

    def profiles(self, contents):
        encoded = [base64.b64encode(c).decode() for c in contents]
        response = self.ask(op="profiles", keys=encoded)
        return [{k: base64.b64decode(v) for k, v in pairs} for pairs in response.get("profiles", [])]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH: the differential tests against Go's string semantics are skipped")
    binary = str(tmp_path_factory.mktemp("go-oracle") / "plugin-names-oracle")
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="", GOWORK="off", GOPROXY="off", CGO_ENABLED="0")
    subprocess.run([go, "build", "-o", binary, ORACLE_SOURCE], check=True, env=env, cwd=os.path.dirname(ORACLE_SOURCE),
                   timeout=300)
    running = Oracle(binary)
    yield running
    running.close()


def _b(text):
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text


# Adversarial pci.ids texts; each is checked for every key of KEYS.
ADVERSARIAL_TEXTS = [
    "10de0  Not NVIDIA\n\t2330  FAKE\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n",
    "8086  Intel\n\t2330  DH89xxCC SMBus Controller\n\t0001  x\n10de  NVIDIA Corporation\n\t2330  GH100\n",
    NVIDIA_BLOCK + "\t0001  GA/102.x+y [A10] (rev a1)\n\t0002  straße ıİ ﬀ\u00a0x\u0085y\u2003z K ǅ ſ\n"
    "\t0003\u00a0 nbsp lead\n\t0004  tail\u3000\n\t0005  a\vb\fc\x1c d\x1f\n\t0006  \x85lead nel\u180e\n"
    "# a comment inside the block\n\t0007\ta\tb\t\n\t0008  0008 twice 0008\n\t0009\n\t000a   \n\t000b  []\n"
    "\t000c  ---\n\t000dd  longer id\n\t00AB  upper-case id\n\t\t10de 0001  subsystem\n\t000e  after sub\n"
    "\t000f  a\rb\n\t0010  \u0130\u0131\u1e9e\u1f80\u1fb3 \u2160x\n",
    (NVIDIA_BLOCK + "\t0001  crlf line\n\t0002  cr cr\r\n\t0011\r\n\t0011\r  later\n\t0003  last\r").replace(
        "\n", "\r\n"),
    NVIDIA_BLOCK + "\t0001  a\n\n\t0002  after an empty line\n",
    NVIDIA_BLOCK + " # indented\n\t0001  never\n",
    "10DE  upper vendor\n\t0001  x\n",
    "",
    "\n\n",
    NVIDIA_BLOCK + "\t0001  no newline at the end",
    b"10de  NVIDIA \xff\n\t0001  A\xffB\xe2\x82 C\xc3\n\t0002  \xed\xa0\x80x\xef\xbf\xbd\n\t0003 \xc2\xa0 \xf4\x90\x80\x80q\n",
    NVIDIA_BLOCK + "\t0001  first\n" + "#" * 65535 + "\n\t0002  after 65535\n" + "#" * 65536 + "\n\t0003  after 65536\n",
    NVIDIA_BLOCK + "#" * 65534 + "\r\n\t0001  after 65534+cr\n" + "#" * 65535 + "\r\n\t0002  after 65535+cr\n",
    NVIDIA_BLOCK + "\t0001  x\n" + "#" * 65535,
    NVIDIA_BLOCK + "\t0001  x\n\t0002  " + "y" * 65536,
    "#" * 70000 + "\n" + NVIDIA_BLOCK + "\t0001  x\n",
    "1111  Vendor\n\t0001 0001  Twice\n10de  NVIDIA\n\t0001  A\n\t0002 x 0002\n  0003  lead blanks\n",
]
KEYS = ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "000a", "000b", "000c", "000d",
        "000e", "000f", "0010", "00ab", "00AB", "2330", "ffff", "", "0", "00", "000", "x", "NVIDIA_A10-12Q", "0011\r"]
MDEV_NAMES = [b"NVIDIA A10-12Q\n", b"NVIDIA A10-12Q \n", b"NVIDIA\tA10-12Q\n", b"NVIDIA\vA10-12Q\n",
              b"\n\nNVIDIA A10\n\n", b"NVIDIA A10\r\n", b" lead", b"", b"\n", b"2330", b"2330\n", b"233", b"0",
              b"0001", b"000", b"a\xc2\x85b", "straße".encode(), b"\xff\xfe", b"NVIDIA\xc2\xa0A10", b"x\fy\n",
              b"\r\n", b"\n \n", b"GRID T4-1Q\n", b"Single port serial\n", b"\t0001", b"0001 x", b"26b9"]
PROFILE_CONTENTS = [
    b"GPU Type ID : vGPU Name\n1428 : NVIDIA H200X-141C\n",
    b" 12 :NVIDIA L40S-8Q \r\n 13: NVIDIA  L40S-12Q\t\n12 : dup\n",
    b"\xc2\xa012 : A\xc2\xa0", b"12 : A\xc2\xa0\n13 : B\xc2\xa0\n", b"12 : \vNVIDIA\v", b"0012 : x\n12 : y",
    b"12 :\n", b"abc : x", b"12 : a:b", "\u3000 5 : x \u3000".encode(), "12 : straße\n".encode(),
    b"", b"\n\n", b"12 : \xff\xfe x \n", b"1\t:\tNVIDIA\tA16-2B\f\n", b"12 : a\rb\r\n", b"\x0b7 : x",
    b"\xc2\x857 : x\xc2\x85",
]


def test_oracle_unicode_tables_match_the_port(oracle):
    """ToUpper and IsSpace for every code point, against Go's unicode package."""
    response = oracle.ask(op="unicode")
    go_upper = dict(response["upper"])
    go_space = set(response["spaces"])
    ascii_from_non_ascii = set()
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        mine = pn.go_to_upper(char)
        expected = chr(go_upper.get(code, code))
        if code >= 0x80 and mine.isascii():
            ascii_from_non_ascii.add(code)
        # Characters unassigned in Python's older or newer Unicode database may differ; nothing else.
        if mine != expected:
            assert unicodedata.category(char) == "Cn", (hex(code), mine, expected)
        assert (pn.go_trim_space(char) == "") == (code in go_space), hex(code)
    assert ascii_from_non_ascii == {code for code, up in go_upper.items() if code >= 0x80 and up < 0x80} == {0x131, 0x17F}


def test_oracle_on_adversarial_pci_ids(oracle):
    keys = [_b(k) for k in KEYS]
    for index, text in enumerate(ADVERSARIAL_TEXTS):
        data = _b(text)
        oracle.load("adv%d" % index, data)
        for op, scoped in (("device", True), ("device_unscoped", False)):
            got = oracle.results(op, keys, "adv%d" % index)
            mine = pn.plugin_device_names(data, KEYS, vendor_scoped=scoped)
            assert [_b(mine[k]) for k in KEYS] == got, (index, op)
        got = oracle.results("mdev", MDEV_NAMES, "adv%d" % index)
        assert [_sfx(pn.vgpu_resource_name(raw, data)) for raw in MDEV_NAMES] == got, index


def test_oracle_on_vendor_vgpu_profiles(oracle):
    got = oracle.profiles(PROFILE_CONTENTS)
    mine = [{k: _sfx(v) for k, v in pn.vendor_vgpu_resource_names(c).items()} for c in PROFILE_CONTENTS]
    assert mine == got


@needs_upstream
def test_oracle_on_the_plugin_pci_ids(oracle, plugin_pci_ids, nvidia_ids):
    oracle.load("plugin", plugin_pci_ids)
    absent = ["0000", "ffff", "2331", "abcd", "1000", "10de"]
    keys = nvidia_ids + absent
    got = oracle.results("device", [k.encode() for k in keys], "plugin")
    for key, name in zip(keys, got):
        assert pn.passthrough_resource_name(key).encode() == b"nvidia.com/" + (name or key.encode()), key
    sample = nvidia_ids[::40] + absent + ["2330", "26b9", "2236"]
    got = oracle.results("device_unscoped", [k.encode() for k in sample], "plugin")
    assert [_b(n) for n in pn.plugin_device_names(plugin_pci_ids, sample, vendor_scoped=False).values()] == got
    got = oracle.results("mdev", MDEV_NAMES, "plugin")
    assert [_sfx(pn.vgpu_resource_name(raw)) for raw in MDEV_NAMES] == got


# Lines of a made-up pci.ids: vendor lines (some that look like 10de), device and subsystem lines,
# comments and blanks, with names from an alphabet of the characters the port must treat like Go.
ODD_CHARS = list("aZz09 /.+-_[]()#:\t\v\f\r\n") + [
    "\x85", "\xa0", "\u2003", "\u3000", "\u180e", "\x1c", "ß", "ı", "ſ", "ﬀ", "ǅ", "\u212a", "\u1f80", "\ufffd", "\udcff"]
IDS = ["2330", "233", "0001", "10de", "ffff", ""]
ODD_NAMES = hs.text(alphabet=hs.sampled_from(ODD_CHARS), max_size=12)
PCI_LINES = hs.one_of(
    hs.builds(lambda v, n: v + n, hs.sampled_from(["10de", "10de0", "10DE", "8086", " 10de", "#10de"]), ODD_NAMES),
    hs.builds(lambda i, s, n: "\t" + i + s + n, hs.sampled_from(IDS), hs.sampled_from(["  ", " ", "\t", "", "\u00a0"]),
              ODD_NAMES),
    hs.builds(lambda n: "\t\t10de 2330" + n, ODD_NAMES),
    hs.builds(lambda n: "#" + n, ODD_NAMES),
    hs.sampled_from(["", " ", "\r"]),
)


@settings(max_examples=300, deadline=None)
@given(body=hs.lists(PCI_LINES, max_size=8), newline=hs.sampled_from(["\n", "\r\n"]), key=hs.sampled_from(IDS + ["2"]),
       raw=hs.binary(max_size=8) | ODD_NAMES.map(_b), profile=hs.lists(ODD_NAMES, max_size=4))
def test_oracle_on_generated_input(oracle, body, newline, key, raw, profile):
    data = _b(newline.join(body))
    oracle.load("gen", data)
    assert oracle.results("device", [_b(key)], "gen") == [_b(pn.plugin_device_name(data, key))]
    assert oracle.results("device_unscoped", [_b(key)], "gen") == [_b(pn.plugin_device_name(data, key, False))]
    assert oracle.results("mdev", [raw], "gen") == [_sfx(pn.vgpu_resource_name(raw, data))]
    content = _b("\n".join("%d : %s" % (n, p) for n, p in enumerate(profile)))
    mine = {k: _sfx(v) for k, v in pn.vendor_vgpu_resource_names(content).items()}
    assert oracle.profiles([content]) == [mine]


# ---------------------------------------------------------------------------------------------
# Reading the user's pci.ids (issue 26, item 7): every bad path is the same clear error
# ---------------------------------------------------------------------------------------------

def test_read_pci_ids_reads_the_file_and_nothing_without_a_path(tmp_path):
    ids = tmp_path / "pci.ids"
    ids.write_bytes(b"10de  NVIDIA Corporation\n")
    assert pn.read_pci_ids(str(ids)) == b"10de  NVIDIA Corporation\n"
    assert pn.read_pci_ids(None) is None and pn.read_pci_ids("") is None


@pytest.mark.parametrize("make_path, why", [
    (lambda tmp: str(tmp / "pci.ids") + "\x00.txt", "a file name cannot hold a NUL byte"),
    (lambda tmp: (str(tmp / "pci.ids") + "\x00").encode(), "a file name cannot hold a NUL byte"),
    (lambda tmp: str(tmp / "missing"), "No such file or directory"),
    (str, "Is a directory"),
    (lambda tmp: 42, "not a path"),
])
def test_read_pci_ids_names_a_path_it_cannot_read(tmp_path, make_path, why):
    (tmp_path / "pci.ids").write_bytes(b"10de  NVIDIA Corporation\n")
    path = make_path(tmp_path)
    with pytest.raises(pn.PluginNameError) as caught:
        pn.read_pci_ids(path, what="plugin_pci_ids")
    msg = caught.value.msg
    assert msg.startswith("cannot read plugin_pci_ids ") and why in msg, msg
    assert "give the path of the pci.ids file" in msg
    # The NUL byte is shown escaped, never written raw into a message.
    assert "\x00" not in msg
    if isinstance(path, str) and "\x00" in path:
        assert "\\x00" in msg
