"""Every role's README lists the variables it exports, and only those.

A role sets names with set_fact and register (tasks/ and handlers/, blocks walked). A name is exported when
something outside the role uses it: another role's files, the playbooks (playbooks/tasks too), the molecule
scenarios or the plugins (a filter reads it). Comments and READMEs do not count; tests do not either. Each
README has a section `## Exported variables`: a table row per exported name (`| `name` | type | set when |
description |`), or, for a role that exports nothing, one sentence saying so.
"""

import glob
import io
import os
import functools
import re
import tokenize

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(TOP, "roles", "*", "tasks")))
SECTION = "## Exported variables"
HEADER = "| variable | type | set when | description |"


class _Loader(yaml.SafeLoader):
    """safe_load that takes Ansible's tags (!vault, !unsafe) as plain scalars."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.load_all(handle, Loader=_Loader) if doc is not None]


def _set_in(tasks, names):
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        for key in ("ansible.builtin.set_fact", "set_fact"):
            if key in task:
                assert isinstance(task[key], dict), "free-form set_fact in %r: give it key: value pairs" % task.get("name")
                names.update(k for k in task[key] if k != "cacheable")
        if isinstance(task.get("register"), str):
            names.add(task["register"])
        for key in ("block", "rescue", "always"):
            _set_in(task.get(key), names)
    return names


@functools.lru_cache(maxsize=None)
def set_by(role):
    """The names the role's tasks and handlers set (set_fact keys, register)."""
    names = set()
    for path in sorted(glob.glob(os.path.join(TOP, "roles", role, "tasks", "*.yml"))
                       + glob.glob(os.path.join(TOP, "roles", role, "handlers", "*.yml"))):
        for doc in _load(path):
            _set_in(doc, names)
    return frozenset(names)


def _strings(node):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)
    elif isinstance(node, str):
        yield node


def _text(path):
    """What a file says, comments left out: YAML keys and values; Python names and strings."""
    if path.endswith((".yml", ".yaml")):
        return "\n".join(s for doc in _load(path) for s in _strings(doc))
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    if path.endswith(".py"):
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return "\n".join(t.string for t in tokens if t.type in (tokenize.NAME, tokenize.STRING))
    return source


def _reader_files():
    files = []
    for pattern in ("roles/*/**/*", "playbooks/**/*", "extensions/molecule/**/*", "plugins/**/*"):
        files += glob.glob(os.path.join(TOP, pattern), recursive=True)
    return sorted(f for f in files if os.path.isfile(f) and f.endswith((".yml", ".yaml", ".py", ".j2")))


# Each reader file's words: a name is used where it stands as a whole word (not inside a longer name).
READERS = {os.path.relpath(f, TOP): frozenset(re.findall(r"\w+", _text(f))) for f in _reader_files()}


def readers(role, name):
    """The files outside the role that use the name."""
    own = os.path.join("roles", role) + os.sep
    return sorted(path for path, words in READERS.items() if not path.startswith(own) and name in words)


@functools.lru_cache(maxsize=None)
def exported(role):
    return frozenset(name for name in set_by(role) if readers(role, name))


def section(role):
    with open(os.path.join(TOP, "roles", role, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert text.count("\n" + SECTION + "\n") == 1, "roles/%s/README.md needs one section %r" % (role, SECTION)
    body = text.split("\n" + SECTION + "\n", 1)[1]
    body = re.split(r"\n#{1,2} |\nThe full specification is in ", body)[0]
    return body.strip()


def listed(role):
    lines = [line for line in section(role).splitlines() if line.startswith("|")]
    return set(m.group(1) for m in (re.match(r"\| `([A-Za-z0-9_]+)` \|", line) for line in lines[2:]) if m)


@pytest.mark.parametrize("role", ROLES)
def test_every_export_is_listed(role):
    missing = dict((name, readers(role, name)) for name in sorted(exported(role) - listed(role)))
    assert missing == {}, "roles/%s/README.md %s lacks rows for (name: read by)" % (role, SECTION)


@pytest.mark.parametrize("role", ROLES)
def test_every_row_is_set_and_read_elsewhere(role):
    assert listed(role) - set_by(role) == set(), "rows for names the role does not set"
    assert listed(role) - exported(role) == set(), "rows for names nothing outside the role reads (internal)"


@pytest.mark.parametrize("role", ROLES)
def test_the_section_is_a_table_or_one_sentence(role):
    body = section(role)
    lines = body.splitlines()
    if exported(role):
        assert lines[0] == HEADER and re.match(r"\|(-+\|){4}$", lines[1]), "the section starts with the table"
        table = [line for line in lines if line.startswith("|")]
        assert all(re.match(r"\| `[A-Za-z0-9_]+` \|( [^|]+ \|){3}$", line) for line in table[2:]), table
        assert len(table) - 2 == len(listed(role)), "one row per name"
    else:
        assert body and "|" not in body and "\n" not in body, "a role that exports nothing says so in one sentence"
        assert len(re.findall(r"[.!?](\s|$)", body)) == 1, "one sentence: %r" % body


def test_the_scan_finds_the_known_hand_offs():
    assert "preflight_vfio_binding_mode" in exported("preflight")  # host_prepare's and host_verify's defaults
    assert "host_verify_report" in exported("host_verify")  # playbooks, filters
    assert "host_reboot_elapsed" in exported("host_reboot")  # the molecule switch scenario
    assert "cluster_nodes_result" in exported("cluster_nodes")  # a registered result, read by cluster.yml
    assert "__vgpu_manager_image_tmp" in set_by("vgpu_manager_image")  # registered inside a block
    assert "__preflight_bind" not in set_by("preflight")  # a task's vars are not set names
    assert not exported("discover")


def test_comments_do_not_count_as_readers(tmp_path):
    path = tmp_path / "x.yml"
    path.write_text("# reads host_verify_report\n- name: x\n  debug: {msg: preflight_type}\n", encoding="utf-8")
    assert "host_verify_report" not in _text(str(path)) and "preflight_type" in _text(str(path))
    path = tmp_path / "x.py"
    path.write_text("# host_verify_report\nx = 'preflight_type'\n", encoding="utf-8")
    assert "host_verify_report" not in _text(str(path)) and "preflight_type" in _text(str(path))
