"""The troubleshooting page of the docs site, generated from the modules' source (scripts/gen-troubleshooting.py)."""

import ast
import importlib.util
import os
import re

import docutils.core
import docutils.utils

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = importlib.util.spec_from_file_location("gen_troubleshooting", os.path.join(TOP, "scripts", "gen-troubleshooting.py"))
gen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gen)


def test_every_module_has_a_section_with_its_faults():
    page = gen.render(TOP)
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(TOP, "plugins", "modules")) if f.endswith(".py"))
    for module in modules:
        assert "\ngpuops.sandbox.%s\n" % module in page
        assert gen.module_faults(TOP, module), "no fault found for %s" % module


def test_every_literal_message_raised_in_the_sources_is_on_the_page():
    """Read the raise statements with a regular expression, independently of the generator's AST walk, in the
    modules and the module_utils they import (directly or through another module_utils; the page is the modules'
    faults: a module_utils only filters use reports through them)."""
    page = " ".join(gen.render(TOP).split())
    utils_dir = os.path.join(TOP, "plugins", "module_utils")
    modules_dir = os.path.join(TOP, "plugins", "modules")
    imported = re.compile(r"plugins\.module_utils(?:\.(\w+))? import ([\w, ()\n]+)")

    def uses(path):
        names = set()
        for match in imported.finditer(open(path, encoding="utf-8").read()):
            names.update([match.group(1)] if match.group(1) else re.findall(r"\w+", match.group(2)))
        return {n for n in names if os.path.isfile(os.path.join(utils_dir, n + ".py"))}

    files = [os.path.join(modules_dir, n) for n in os.listdir(modules_dir) if n.endswith(".py")]
    seen, todo = set(), set().union(*(uses(f) for f in files))
    while todo:
        name = todo.pop()
        seen.add(name)
        todo |= uses(os.path.join(utils_dir, name + ".py")) - seen
    files += [os.path.join(utils_dir, n + ".py") for n in sorted(seen)]
    assert len(seen) > 5, seen
    checked = 0
    for path in files:
        source = open(path, encoding="utf-8").read()
        for match in re.finditer(r'raise \w+Error\(\s*"([^"%\\]{12,})', source):
            fragment = " ".join(match.group(1).split())
            assert fragment in page, "%s: %r is not on the troubleshooting page" % (os.path.basename(path), fragment)
            checked += 1
    assert checked > 20


def test_message_templates():
    def template(code):
        return gen.message_template(ast.parse(code, mode="eval").body)

    assert template('"cannot read %s: %s" % (a, b)') == "cannot read ...: ..."
    assert template('"a %r" "b %d%%" % (x, y)') == "a ...b ...%"
    assert template('f"x {a} y"') == "x ... y"
    assert template('"p " + str(x)') == "p ..."
    assert template("msg") is None
    source = ('E_X = "ex"\ndef f():\n    raise FooError("bad %s" % v, kind=E_X)\n'
              'def g(m):\n    m.fail_json(msg="no %d" % 3)\n')
    faults = gen.faults_in_source(source)[0]
    assert faults == [("FooError", "ex", "bad ..."), ("fail_json", "", "no ...")]


def test_the_page_is_valid_restructuredtext():
    page = gen.render(TOP)
    # Sphinx roles are unknown to plain docutils; everything else must parse without a warning.
    plain = page.replace(":ansplugin:", "")
    docutils.core.publish_doctree(plain, settings_overrides={"report_level": docutils.utils.Reporter.WARNING_LEVEL,
                                                             "halt_level": docutils.utils.Reporter.WARNING_LEVEL})
