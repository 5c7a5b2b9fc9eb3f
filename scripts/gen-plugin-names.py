#!/usr/bin/env python
"""Write the sandbox device plugin's naming table into plugins/module_utils/_plugin_names.py.

The NVIDIA sandbox device plugin names a passthrough GPU from the pci.ids file inside its own image.
This script runs the collection's port of that rule (the functions of _plugin_names.py itself) on that
file for every device of the NVIDIA (10de) vendor block and rewrites the generated section of
_plugin_names.py: the image and its version (from the GPU Operator chart's values.yaml,
``sandboxDevicePlugin``), the pci.ids version and ``PASSTHROUGH_RESOURCE_NAMES`` sorted by device ID.
It also checks the shape of the block that the table-based lookups of _plugin_names.py rely on.

Usage: gen-plugin-names.py PCI_IDS VALUES_YAML [--module FILE] [--check]
  PCI_IDS      the plugin's pci.ids (its repository's utils/pci.ids, /usr/pci.ids in the image)
  VALUES_YAML  the GPU Operator chart's values.yaml whose sandboxDevicePlugin image is the one named
  --check      write nothing; exit 1 when the module's section differs from what would be written
"""

import argparse
import importlib.util
import json
import os
import re
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(TOP, "plugins", "module_utils", "_plugin_names.py")
BEGIN = "# BEGIN GENERATED PLUGIN NAMES\n"
END = "# END GENERATED PLUGIN NAMES\n"
DEVICE_LINE_RE = re.compile(rb"\A\t([0-9a-f]{4})[ \t]+(.*)\Z", re.S)
VERSION_RE = re.compile(rb"^#\s*Version:\s*(\S+)\s*$", re.M)


def load_port(path):
    spec = importlib.util.spec_from_file_location("_plugin_names_port", path)
    port = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port)
    return port


def sandbox_image(values_text):
    """Return ``(repository/image, version)`` of the top-level ``sandboxDevicePlugin`` key of values.yaml."""
    fields, inside = {}, False
    for line in values_text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            if inside:
                break
            inside = line.rstrip() == "sandboxDevicePlugin:"
            continue
        if inside:
            match = re.match(r"^  ([A-Za-z]+):\s*(.*?)\s*$", line)
            if match:
                fields[match.group(1)] = match.group(2).strip("'\"")
    missing = [key for key in ("repository", "image", "version") if not fields.get(key)]
    if missing:
        raise SystemExit("values.yaml: sandboxDevicePlugin has no %s" % ", ".join(missing))
    return "%s/%s" % (fields["repository"], fields["image"]), fields["version"]


def nvidia_device_lines(port, data):
    """Return the device IDs of the NVIDIA block in file order, checking the shape the table lookups need.

    Every non-comment line of the block is a subsystem line (two tabs) or a device line: a tab, four
    lower-case hex digits, blanks and a name that starts with no white space; the first one is a device
    line and the IDs ascend.
    """
    lines = port.scan_lines(data)
    if not any(line.startswith(b"10de") for line in lines):
        raise SystemExit("pci.ids: no line starts with 10de")
    ids = []
    for line in lines:
        if line.startswith(b"#"):
            continue
        if not line.startswith(b"\t"):
            break
        if line.startswith(b"\t\t") and ids:
            continue
        match = DEVICE_LINE_RE.match(line)
        name = match.group(2).decode("utf-8", "surrogateescape") if match else ""
        if not name or not port.go_trim_space(name[:1]):
            raise SystemExit("pci.ids: unexpected line in the NVIDIA block: %r" % line)
        device_id = match.group(1).decode("ascii")
        if ids and device_id <= ids[-1]:
            raise SystemExit("pci.ids: device %s is out of order (after %s)" % (device_id, ids[-1]))
        ids.append(device_id)
    if not ids:
        raise SystemExit("pci.ids: the NVIDIA block has no device")
    return ids


def render(port, data, values_text):
    image, version = sandbox_image(values_text)
    found = VERSION_RE.search(data)
    if not found:
        raise SystemExit("pci.ids: no '# Version:' header")
    ids = nvidia_device_lines(port, data)
    names = port.plugin_device_names(data, ids)
    empty = [device_id for device_id in ids if not names[device_id]]
    if empty:
        raise SystemExit("pci.ids: devices without a name (the table lookups assume none): %s" % ", ".join(empty))
    out = [BEGIN]
    out.append("# The sandbox device plugin image the GPU Operator chart deploys (values.yaml sandboxDevicePlugin).\n")
    out.append("PLUGIN_IMAGE = %s\n" % json.dumps(image))
    out.append("PLUGIN_IMAGE_VERSION = %s\n" % json.dumps(version))
    out.append("# Version header of the pci.ids inside that image.\n")
    out.append("PCI_IDS_VERSION = %s\n" % json.dumps(found.group(1).decode("ascii")))
    out.append("# Device ID -> resource name for every device of the NVIDIA (10de) block of that pci.ids.\n")
    out.append("PASSTHROUGH_RESOURCE_NAMES = {\n")
    for device_id in sorted(ids):
        out.append("    %s: %s,\n" % (json.dumps(device_id), json.dumps(port.RESOURCE_PREFIX + names[device_id])))
    out.append("}\n")
    out.append(END)
    return "".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("pci_ids")
    parser.add_argument("values_yaml")
    parser.add_argument("--module", default=MODULE)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with open(args.pci_ids, "rb") as handle:
        data = handle.read()
    with open(args.values_yaml, encoding="utf-8") as handle:
        values_text = handle.read()
    with open(args.module, encoding="utf-8") as handle:
        source = handle.read()
    if source.count(BEGIN) != 1 or source.count(END) != 1 or source.index(BEGIN) > source.index(END):
        raise SystemExit("%s: expected one generated section between %r and %r"
                         % (os.path.basename(args.module), BEGIN.strip(), END.strip()))
    section = render(load_port(args.module), data, values_text)
    start = source.index(BEGIN)
    stop = source.index(END) + len(END)
    new = source[:start] + section + source[stop:]
    if args.check:
        if new != source:
            print("%s: the generated section is out of date; run scripts/gen-plugin-names.py" % os.path.basename(args.module))
            return 1
        return 0
    if new != source:
        with open(args.module, "w", encoding="utf-8") as handle:
            handle.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
