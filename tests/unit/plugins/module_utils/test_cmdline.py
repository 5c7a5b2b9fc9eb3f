# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.gpuops.sandbox.plugins.module_utils import _cmdline as cl
from ansible_collections.gpuops.sandbox.plugins.module_utils import _shellvars as sv
from ansible_collections.gpuops.sandbox.tests.unit.fakes import grub_files

DEBIAN_GRUB = grub_files.DEBIAN_GRUB + "#GRUB_TERMINAL=console\n"


def args(items, state="present", replace=True):
    return cl.parse_args(items, state, replace)


# --- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("good", ["quiet", "intel_iommu=on", "iommu=pt", "vfio-pci.ids=10de:2236,10de:1aef",
                                  "console=ttyS0,115200n8", "crashkernel=1G-4G:192M,4G-:256M", "root=UUID=ab-12",
                                  "rd.lvm.lv=rhel/root", "hugepagesz=1G", "_x=~a@b%c+d"])
def test_parse_arg_accepts(good):
    assert cl.parse_arg(good).text == good


@pytest.mark.parametrize("bad, fragment", [
    ("foo=$(id)", "'$'"),
    ("foo=`id`", "'`'"),
    ("a b", "unsafe or invalid key 'a b'"),
    ("a=b c", "' '"),
    ('x="y"', "'\"'"),
    ("x='y'", "\"'\""),
    ("a;b", "invalid key"),
    ("a=b;c", "';'"),
    ("a=b\\c", "'\\\\'"),
    ("a=b\nc", "'\\n'"),
    ("", "empty"),
    ("key=", "no value"),
    ("-x", "invalid key"),
    ("=x", "invalid key"),
    (True, "a boolean"),
    (False, "a boolean"),
    (None, "null"),
    (1, "an integer"),
    ({"a": 1}, "a mapping"),
])
def test_parse_arg_rejects_and_names_value(bad, fragment):
    with pytest.raises(cl.CmdlineError) as info:
        cl.parse_arg(bad)
    assert fragment in info.value.msg
    assert repr(bad) in info.value.msg
    assert "accepted" in info.value.msg or "no value" in info.value.msg


@pytest.mark.parametrize("bad, fragment", [
    ("iommu=pt\n", "('\\n'; control and invisible characters"),
    ("quiet\n", "invalid key 'quiet\\n' (characters not accepted: '\\n'; control"),
    ("intel_iommu=on\r\n", "'\\n', '\\r'; control"),
    ("a=b\x00", "'\\x00'; control"),
    ("a=\x1b[1m", "'\\x1b', '['; control"),
    ("a\tb", "'\\t'; control"),
    ("a=b\x7f", "'\\x7f'; control"),
    ("a=b\u200b", "'\\u200b'; control"),
    ("a=b\u2028", "'\\u2028'"),
    ("iommu=p\u00e9", "('\u00e9')"),
    ("\u00e9=1", "invalid key"),
])
def test_trailing_newline_and_control_characters_refused(bad, fragment):
    """``re.match`` with ``$`` let 'iommu=pt\\n' through: it was then written into /etc/kernel/cmdline."""
    with pytest.raises(cl.CmdlineError) as info:
        cl.parse_arg(bad)
    assert "kernel argument %r" % bad in info.value.msg
    assert fragment in info.value.msg, info.value.msg
    assert info.value.msg.endswith("accepted: " + cl.ACCEPTED_TEXT)


def test_parse_args_duplicates():
    assert [a.text for a in args(["iommu=pt", "iommu=pt", "quiet"])] == ["iommu=pt", "quiet"]
    with pytest.raises(cl.CmdlineError, match="replace_values=false"):
        args(["console=tty0", "console=ttyS0"])
    assert len(args(["console=tty0", "console=ttyS0"], replace=False)) == 2
    assert len(args(["console=tty0", "console=ttyS0"], state="absent")) == 2
    with pytest.raises(cl.CmdlineError, match="non-empty"):
        args([])


# --- merging ------------------------------------------------------------------------------------

def test_present_replaces_conflict_in_place_and_keeps_order():
    segs = [["ro", "intel_iommu=off", "quiet"], ["splash"]]
    out = cl.apply_args(segs, args(["intel_iommu=on", "iommu=pt"]), "present")
    assert out == [["ro", "intel_iommu=on", "quiet", "iommu=pt"], ["splash"]]
    assert segs == [["ro", "intel_iommu=off", "quiet"], ["splash"]]  # input untouched


def test_present_conflict_in_second_segment_and_duplicates_removed():
    segs = [["a", "intel_iommu=on"], ["intel_iommu=off", "b", "intel_iommu=on"]]
    out = cl.apply_args(segs, args(["intel_iommu=on"]), "present")
    assert out == [["a", "intel_iommu=on"], ["b"]]


def test_dash_and_underscore_keys_are_equal():
    out = cl.apply_args([["vfio_pci.ids=1:2"]], args(["vfio-pci.ids=10de:2236"]), "present")
    assert out == [["vfio-pci.ids=10de:2236"]]


def test_present_without_replace_adds_second_console():
    out = cl.apply_args([["console=tty0"]], args(["console=ttyS0,115200"], replace=False), "present", False)
    assert out == [["console=tty0", "console=ttyS0,115200"]]
    again = cl.apply_args(out, args(["console=ttyS0,115200"], replace=False), "present", False)
    assert again == out


def test_absent_by_key_and_by_value():
    segs = [["a", "iommu=soft", "iommu=pt", "nomodeset", "nomodeset=1"]]
    assert cl.apply_args(segs, args(["nomodeset"], "absent"), "absent") == [["a", "iommu=soft", "iommu=pt"]]
    expected = [["a", "iommu=pt", "nomodeset", "nomodeset=1"]]
    assert cl.apply_args(segs, args(["iommu=soft"], "absent"), "absent") == expected


def test_satisfies():
    tokens = ["BOOT_IMAGE=/vmlinuz", "intel_iommu=on", "iommu=pt", "console=tty0", "console=ttyS0"]
    assert cl.satisfies(tokens, args(["intel_iommu=on", "iommu=pt"]), "present")
    assert not cl.satisfies(tokens + ["intel_iommu=off"], args(["intel_iommu=on"]), "present")
    assert not cl.satisfies(tokens, args(["console=ttyS0"]), "present")
    assert cl.satisfies(tokens, args(["console=ttyS0"], replace=False), "present", False)
    assert cl.satisfies(tokens, args(["nomodeset", "iommu=soft"], "absent"), "absent")
    assert not cl.satisfies(tokens, args(["iommu"], "absent"), "absent")


def test_split_cmdline_keeps_quoted_tokens():
    assert cl.split_cmdline(' a  b="c d"\te\n') == ["a", 'b="c d"', "e"]
    assert cl.split_cmdline("") == []


def kernel_parse_args(text):
    """The kernel's parse_args/next_arg (lib/cmdline.c), line for line on a NUL-terminated copy: the reference."""
    buf = list(text) + ["\0"]
    pos = 0
    result = []

    def skip_spaces(at):
        while buf[at] != "\0" and buf[at].isspace():
            at += 1
        return at

    def string(at):
        return "".join(buf[at:buf.index("\0", at)])

    pos = skip_spaces(pos)
    while buf[pos] != "\0":
        args = pos
        equals = 0
        in_quote = quoted = False
        if buf[args] == '"':
            args += 1
            in_quote = quoted = True
        i = 0
        while buf[args + i] != "\0":
            if buf[args + i].isspace() and not in_quote:
                break
            if equals == 0 and buf[args + i] == "=":
                equals = i
            if buf[args + i] == '"':
                in_quote = not in_quote
            i += 1
        param, val = args, None
        if equals:
            buf[args + equals] = "\0"
            val = args + equals + 1
            if buf[val] == '"':
                val += 1
                if buf[args + i - 1] == '"':
                    buf[args + i - 1] = "\0"
        if quoted and buf[args + i - 1] == '"':
            buf[args + i - 1] = "\0"
        if buf[args + i] != "\0":
            buf[args + i] = "\0"
            pos = args + i + 1
        else:
            pos = args + i
        pos = skip_spaces(pos)
        key, value = string(param), None if val is None else string(val)
        if value is None and key == "--":
            break
        result.append((key, value))
    return result


def test_parse_cmdline_removes_the_quotes_the_kernel_removes():
    assert cl.parse_cmdline('ro dyndbg="file x.c +p" "a=b c" a="" "x" -- init=1') == [
        ("ro", None), ("dyndbg", "file x.c +p"), ("a", "b c"), ("a", ""), ("x", None)]
    # A quote inside a value or a key stays, as in the kernel (a tokenizer that dropped every quote said "ab cd").
    assert cl.parse_cmdline('key=a"b c"d "a"=b =x a=b"') == [
        ("key", 'a"b c"d'), ('a"', "b"), ("=x", None), ("a", 'b"')]
    assert [cl.kernel_param(t) for t in cl.split_cmdline('key="a b" "k=v" "flag"')] == [
        ("key", "a b"), ("k", "v"), ("flag", None)]


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='ab=" -\t', max_size=30))
def test_parse_cmdline_is_the_kernels(text):
    assert cl.parse_cmdline(text) == kernel_parse_args(text)


SAFE_TOKEN = st.from_regex(r"\A[a-z][a-z0-9_]{0,6}(=[a-z0-9,:.]{1,6})?\Z")


@settings(max_examples=300, deadline=None)
@given(st.lists(SAFE_TOKEN, max_size=12), st.lists(SAFE_TOKEN, max_size=12),
       st.lists(SAFE_TOKEN, min_size=1, max_size=5), st.sampled_from(["present", "absent"]), st.booleans())
def test_apply_properties(seg0, seg1, wanted, state, replace):
    try:
        request = cl.parse_args(wanted, state, replace)
    except cl.CmdlineError:
        return
    out = cl.apply_args([seg0, seg1], request, state, replace)
    merged = out[0] + out[1]
    assert cl.satisfies(merged, request, state, replace)
    # unrelated tokens keep their order and count
    keys = {a.key for a in request}
    unrelated = [t for t in seg0 + seg1 if cl.split_token(t)[0] not in keys]
    assert [t for t in merged if cl.split_token(t)[0] not in keys] == unrelated
    # idempotent
    assert cl.apply_args(out, request, state, replace) == out


# --- grub defaults files ------------------------------------------------------------------------

def write(root, path, text):
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as handle:
        handle.write(text)
    return full


def shell_values(root):
    """What a real shell gets, sourcing the files the way Debian's grub-mkconfig does."""
    script = ('. "$1/etc/default/grub"; for x in "$1"/etc/default/grub.d/*.cfg; do [ -e "$x" ] && . "$x"; done; '
              'printf "%s\\n%s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"')
    out = subprocess.run(["sh", "-c", script, "sh", str(root)], capture_output=True, text=True, check=True,
                         env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}).stdout
    linux, default = out.split("\n", 1)
    return {cl.GRUB_LINUX: linux, cl.GRUB_LINUX_DEFAULT: default}


def test_evaluate_debian_matches_shell(tmp_path):
    write(tmp_path, "/etc/default/grub", DEBIAN_GRUB)
    values, assignments = sv.evaluate_grub_defaults(str(tmp_path))
    assert values == {"GRUB_CMDLINE_LINUX": "", "GRUB_CMDLINE_LINUX_DEFAULT": "console=ttyS0,115200 intel_iommu=off"}
    assert values == shell_values(tmp_path)
    assert len(assignments["GRUB_CMDLINE_LINUX_DEFAULT"]) == 1


def test_evaluate_dropins_in_order_with_references(tmp_path):
    write(tmp_path, "/etc/default/grub", DEBIAN_GRUB)
    write(tmp_path, "/etc/default/grub.d/50-cloudimg-settings.cfg",
          "# Cloud Image specific Grub settings\nGRUB_RECORDFAIL_TIMEOUT=0\nGRUB_TIMEOUT=0\n"
          'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\nGRUB_TERMINAL=console\n')
    write(tmp_path, "/etc/default/grub.d/60-extra.cfg",
          "EXTRA='a=1'\n"
          'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} $EXTRA \\\n  b=2"  # trailing comment\n'
          "export GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT\"' nosplash'\n")
    write(tmp_path, "/etc/default/grub.d/70-not-a-cfg.txt", 'GRUB_CMDLINE_LINUX="ignored"\n')
    values, _assignments = sv.evaluate_grub_defaults(str(tmp_path))
    assert values == shell_values(tmp_path)
    assert cl.split_cmdline(values["GRUB_CMDLINE_LINUX"]) == ["a=1", "b=2"]
    assert values["GRUB_CMDLINE_LINUX_DEFAULT"] == "console=tty1 console=ttyS0 nosplash"


def test_evaluate_override_tries_a_dropin(tmp_path):
    write(tmp_path, "/etc/default/grub", DEBIAN_GRUB)
    dropin = os.path.join(str(tmp_path), "etc/default/grub.d/99-x.cfg")
    values, _a = sv.evaluate_grub_defaults(str(tmp_path), {dropin: 'GRUB_CMDLINE_LINUX="x"\n'})
    assert values["GRUB_CMDLINE_LINUX"] == "x"
    assert not os.path.exists(dropin)


@pytest.mark.parametrize("text, fragment", [
    ('GRUB_CMDLINE_LINUX="$(cat /etc/x)"\n', "command substitution"),
    ('GRUB_CMDLINE_LINUX="`cat /etc/x`"\n', "command substitution"),
    ('X=`uname -r`\nGRUB_CMDLINE_LINUX="a $X"\n', "command substitution"),
    ('if [ -e /x ]; then\n  GRUB_CMDLINE_LINUX="a"\nfi\n', "inside a shell block"),
    ('GRUB_CMDLINE_LINUX+=" a"\n', "shell statement"),
    ('eval GRUB_CMDLINE_LINUX=a\n', "runs or sources"),
    ('. /etc/other\n', "runs or sources"),
    ('GRUB_CMDLINE_LINUX="${X:-a}"\n', "parameter expansion"),
    ('GRUB_CMDLINE_LINUX="a\n', "unterminated double quote"),
    ("GRUB_CMDLINE_LINUX='a\n", "unterminated single quote"),
    ('GRUB_CMDLINE_LINUX=a true\n', "command's environment"),
])
def test_unsupported_shell_is_refused(text, fragment):
    with pytest.raises(cl.CmdlineError) as info:
        sv.parse_grub_defaults(text, "/etc/default/grub", {}, {})
    assert fragment in info.value.msg
    assert "/etc/default/grub" in info.value.msg


def test_untracked_shell_is_tolerated():
    text = ('f() { echo hi; }\nif [ -n "$GRUB_CMDLINE_LINUX" ]; then X=1; fi\nGRUB_THEME=$(ls)\n'
            'case "$a" in b) Y=2;; esac\nGRUB_CMDLINE_LINUX="ok $HOME_NOT_SET"\n')
    env = sv.parse_grub_defaults(text, "f", {}, {})
    assert env["GRUB_CMDLINE_LINUX"] == "ok "


def test_set_grub_variables_rewrites_last_assignment_only():
    text = 'GRUB_CMDLINE_LINUX="one"\n# note\nGRUB_CMDLINE_LINUX="two"\nGRUB_TIMEOUT=5\n'
    out = sv.set_grub_variables(text, "f", {"GRUB_CMDLINE_LINUX": 'x "y" $z', "GRUB_CMDLINE_LINUX_DEFAULT": "q"})
    assert out == ('GRUB_CMDLINE_LINUX="one"\n# note\nGRUB_CMDLINE_LINUX="x \\"y\\" \\$z"\nGRUB_TIMEOUT=5\n'
                   'GRUB_CMDLINE_LINUX_DEFAULT="q"\n')
    env = sv.parse_grub_defaults(out, "f", {}, {})
    assert env["GRUB_CMDLINE_LINUX"] == 'x "y" $z'


def test_render_dropin_roundtrip(tmp_path):
    text = sv.render_grub_dropin({"GRUB_CMDLINE_LINUX_DEFAULT": "a b=1"}, "me")
    env = sv.parse_grub_defaults(text, "d", {}, {})
    assert env == {"GRUB_CMDLINE_LINUX_DEFAULT": "a b=1"}


def test_grubby_info_parsing():
    out = ('index=0\nkernel="/boot/vmlinuz-5.14"\nargs="ro crashkernel=auto intel_iommu=off"\nroot="/dev/x"\n'
           'initrd="/boot/initramfs"\ntitle="RHEL"\nid="abc"\nindex=1\nkernel="non linux entry"\n')
    assert cl.parse_grubby_info(out) == [{"index": "0", "kernel": "/boot/vmlinuz-5.14",
                                          "args": ["ro", "crashkernel=auto", "intel_iommu=off"]}]


def test_proc_and_kernel_cmdline_files(tmp_path):
    assert cl.read_proc_cmdline(str(tmp_path)) is None
    write(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz initrd=\\x root=/dev/sda ro\n")
    assert cl.strip_loader_tokens(cl.read_proc_cmdline(str(tmp_path))) == ["root=/dev/sda", "ro"]
    write(tmp_path, "/etc/kernel/cmdline", "root=/dev/sda\nro quiet\n")
    assert cl.read_kernel_cmdline_file(str(tmp_path)) == ["root=/dev/sda", "ro", "quiet"]
    write(tmp_path, "/boot/loader/entries/a.conf", "title x\nlinux /vmlinuz\noptions root=/dev/sda ro\n")
    assert cl.read_bls_options(cl.bls_entry_files(str(tmp_path))[0]) == ["root=/dev/sda", "ro"]


def test_grub_mkconfig_reads_dropins(tmp_path):
    debian = write(tmp_path, "/a", '#!/bin/sh\nfor x in ${sysconfdir}/default/grub.d/*.cfg ; do :; done\n')
    upstream = write(tmp_path, "/b", "#!/bin/sh\n. ${sysconfdir}/default/grub\n")
    assert sv.grub_mkconfig_reads_dropins(debian) is True
    assert sv.grub_mkconfig_reads_dropins(upstream) is False
    assert sv.grub_mkconfig_reads_dropins(str(tmp_path / "missing")) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_shell_reader_never_crashes(text):
    try:
        sv.parse_grub_defaults(text, "f", {}, {})
    except cl.CmdlineError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.booleans(), st.none(), st.integers(), st.floats(),
                 st.lists(st.text(max_size=3), max_size=2),
                 st.builds(lambda word, tail: word + tail, st.from_regex(r"\A[a-z_]{1,6}(=[a-z0-9]{1,4})?\Z"),
                           st.sampled_from(["\n", "\r\n", "\r", "\x00", "\t", "\x0b", "\x85", "\u2028", "\x7f"]))))
def test_parse_arg_total(item):
    try:
        arg = cl.parse_arg(item)
    except cl.CmdlineError as exc:
        assert repr(item) in exc.msg
        return
    assert isinstance(item, str)
    assert not any(ch in item for ch in " \t\n\"'$`;\\")
    assert item.isascii() and item.isprintable()
    assert arg.text == item


# --- the record of what was replaced, and giving it back ----------------------------------------

def test_apply_absent_with_restore_puts_the_original_in_place():
    segs = [["ro", "intel_iommu=on", "quiet"], ["splash", "iommu=pt"]]
    request = args(["intel_iommu=on", "iommu=pt"], "absent")
    out = cl.apply_args(segs, request, "absent", restore={"intel_iommu": ["intel_iommu=off"]})
    assert out == [["ro", "intel_iommu=off", "quiet"], ["splash"]]
    # nothing of that key removed: nothing given back
    assert cl.apply_args([["ro"]], request, "absent", restore={"intel_iommu": ["intel_iommu=off"]}) == [["ro"]]
    # given back once even when several tokens went
    out = cl.apply_args([["intel_iommu=on", "a", "intel_iommu=on"]], args(["intel_iommu=on"], "absent"), "absent",
                        restore={"intel_iommu": ["intel_iommu=off", "intel_iommu=igfx_off"]})
    assert out == [["intel_iommu=off", "intel_iommu=igfx_off", "a"]]


def test_record_present_keeps_the_first_original_and_added_keys():
    old = ["ro", "intel_iommu=off", "quiet"]
    request = args(["intel_iommu=on", "iommu=pt"])
    new = cl.apply_args([old], request, "present")[0]
    keys, left_out = cl.record_present({}, old, new, request)
    assert keys == {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on"]},
                    "iommu": {"original": [], "set": ["iommu=pt"]}}
    assert left_out == []
    again = args(["intel-iommu=on,sm_on"])
    keys2, _left = cl.record_present(keys, new, cl.apply_args([new], again, "present")[0], again)
    assert keys2["intel_iommu"] == {"original": ["intel_iommu=off"], "set": ["intel-iommu=on,sm_on"]}
    assert keys["intel_iommu"]["set"] == ["intel_iommu=on"]  # input untouched
    # no change: no entry
    assert cl.record_present({}, new, new, request) == ({}, [])


def test_record_present_without_replace_records_added_keys_only():
    old = ["console=tty0"]
    request = args(["console=ttyS0", "hugepages=16"], replace=False)
    new = cl.apply_args([old], request, "present", False)[0]
    keys, _left = cl.record_present({}, old, new, request, False)
    assert keys == {"hugepages": {"original": [], "set": ["hugepages=16"]}}
    more = args(["hugepages=32"], replace=False)
    keys, _left = cl.record_present(keys, new, cl.apply_args([new], more, "present", False)[0], more, False)
    assert keys["hugepages"]["set"] == ["hugepages=16", "hugepages=32"]


def test_record_present_leaves_out_tokens_it_cannot_give_back_safely():
    old = ['dyndbg="file a.c +p"', 'dyndbg="x\x07"']
    request = args(["dyndbg=off"])
    keys, left_out = cl.record_present({}, old, ["dyndbg=off"], request)
    assert keys == {"dyndbg": {"original": ['dyndbg="file a.c +p"'], "set": ["dyndbg=off"]}}
    assert left_out == ['dyndbg="x\x07"']


RECORDED = {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on"]},
            "iommu": {"original": [], "set": ["iommu=pt"]}}


def test_plan_restore_gives_back_and_drops_entries():
    leave = args(["intel_iommu=on", "amd_iommu=on", "iommu=pt"], "absent")
    give_back, keys = cl.plan_restore(RECORDED, ["ro", "intel_iommu=on", "iommu=pt"], leave)
    assert give_back == {"intel_iommu": ["intel_iommu=off"]} and keys == {}
    assert RECORDED["iommu"] == {"original": [], "set": ["iommu=pt"]}  # input untouched
    # restore=false: nothing given back, entries dropped all the same
    assert cl.plan_restore(RECORDED, ["intel_iommu=on", "iommu=pt"], leave, restore=False) == ({}, {})
    # the user changed the value since: their setting wins, the entry goes
    give_back, keys = cl.plan_restore(RECORDED, ["intel_iommu=igfx_off", "iommu=pt"], leave)
    assert give_back == {} and keys == {}
    # a request that removes none of the module's values keeps the entry
    give_back, keys = cl.plan_restore(RECORDED, ["intel_iommu=on", "iommu=pt"], args(["iommu=soft"], "absent"))
    assert give_back == {} and keys == RECORDED
    # a bare KEY removes every value and gives nothing back
    give_back, keys = cl.plan_restore(RECORDED, ["intel_iommu=on", "iommu=pt"], args(["intel_iommu"], "absent"))
    assert give_back == {} and keys == {"iommu": RECORDED["iommu"]}


def test_plan_restore_keeps_entry_while_a_module_value_is_left():
    keys = {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on", "intel_iommu=sm_on"]}}
    tokens = ["intel_iommu=on", "intel_iommu=sm_on"]
    give_back, new = cl.plan_restore(keys, tokens, args(["intel_iommu=on"], "absent"))
    assert give_back == {} and new == {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=sm_on"]}}
    give_back, new = cl.plan_restore(new, ["intel_iommu=sm_on"], args(["intel-iommu=sm_on"], "absent"))
    assert give_back == {"intel_iommu": ["intel_iommu=off"]} and new == {}


def test_record_text_round_trip_and_validation():
    text = cl.render_record(RECORDED)
    assert cl.load_record(text) == RECORDED
    assert cl.render_record({}) is None and cl.load_record(None) == {}
    for bad in ["", "{", "null", '{"version": 1}', '{"version": 1, "keys": {"a": {"original": [], "set": ["b=1"]}}}',
                '{"version": 1, "keys": {"a": {"original": ["a=1 b=2"], "set": ["a=1"]}}}',
                '{"version": 1, "keys": {"a": {"original": [], "set": ["a=1"], "x": 1}}}',
                '{"version": 1, "keys": {"a$": {"original": [], "set": ["a$=1"]}}}',
                '{"version": 1, "keys": {"a": {"original": [1], "set": ["a=1"]}}}', "[" * 100000]:
        with pytest.raises(cl.CmdlineError) as info:
            cl.load_record(bad, "/var/lib/gpuops/kernel_cmdline.json")
        assert "/var/lib/gpuops/kernel_cmdline.json is not a valid record" in info.value.msg


VALUED = st.from_regex(r"\A[a-z][a-z0-9_]{0,6}=[a-z0-9,:.]{1,6}\Z")


@settings(max_examples=300, deadline=None)
@given(st.lists(SAFE_TOKEN, max_size=12), st.lists(SAFE_TOKEN, max_size=12), st.lists(VALUED, min_size=1, max_size=5))
def test_present_then_absent_gives_the_original_line_back(seg0, seg1, wanted):
    """For keys that had at most one value (another than the one asked for), the round trip is exact."""
    try:
        request = cl.parse_args(wanted, "present")
    except cl.CmdlineError:
        return
    old = seg0 + seg1
    for arg in request:
        same = [t for t in old if arg.same_key(t)]
        if len(same) > 1 or any(arg.equals(t) for t in same):
            return
    out = cl.apply_args([seg0, seg1], request, "present")
    keys, left_out = cl.record_present({}, old, out[0] + out[1], request)
    assert left_out == []
    leave = cl.parse_args(wanted, "absent")
    give_back, rest = cl.plan_restore(cl.load_record(cl.render_record(keys)), out[0] + out[1], leave)
    assert rest == {}
    assert cl.apply_args(out, leave, "absent", restore=give_back) == [seg0, seg1]
