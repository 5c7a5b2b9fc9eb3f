#!/usr/bin/env python
"""Write the documentation site's troubleshooting page from the faults the modules report.

Every module turns the exceptions of its module_utils (and its own checks) into ``fail_json`` with a
message a person can act on. This script reads the source, not a hand-kept list, so the page cannot
drift from the code: for each module it follows the collection's module_utils it imports
(transitively), and collects every ``raise SomethingError(...)`` and ``fail_json(msg=...)`` whose
message is a string literal or a ``%``-formatted one, with the error kind when the call names one
(``kind=E_...``). Placeholders become an ellipsis.

Usage: gen-troubleshooting.py [--root DIR] [--output FILE]   (stdout without --output)
"""

import argparse
import ast
import os
import re
import sys

UTILS_PACKAGE = "ansible_collections.gpuops.sandbox.plugins.module_utils"
PLACEHOLDER_RE = re.compile(r"%(\([^)]*\))?[-#0 +]*\d*(\.\d+)?[sdrifx]")


def message_template(node):
    """Return the text of a message expression with placeholders as '...', or None if it has no text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return PLACEHOLDER_RE.sub("...", node.value).replace("%%", "%")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return message_template(node.left)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = message_template(node.left), message_template(node.right)
        if left is None and right is None:
            return None
        return (left or "...") + (right or "...")
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "..." for v in node.values]
        return "".join(parts)
    return None


def _call_name(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _keyword(call, name):
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _kind_of(call, constants):
    node = _keyword(call, "kind")
    if isinstance(node, ast.Attribute):
        node = ast.Name(id=node.attr)
    if isinstance(node, ast.Name):
        return constants.get(node.id, node.id)
    if isinstance(node, ast.Constant):
        return str(node.value)
    return ""


def _clean(text):
    return " ".join(text.split()).strip()


def faults_in_source(source, constants=None):
    """Return [(error class, kind, message)] for the raises and fail_json calls of one source file."""
    tree = ast.parse(source)
    constants = dict(constants or {})
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("E_"):
                    constants[target.id] = node.value.value
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            name = _call_name(node.exc.func)
            if not name.endswith("Error") or not node.exc.args:
                continue
            text = message_template(node.exc.args[0])
            if text and text.strip("."):
                found.append((name, _kind_of(node.exc, constants), _clean(text)))
        elif isinstance(node, ast.Call) and _call_name(node.func) == "fail_json":
            msg = _keyword(node, "msg")
            text = message_template(msg) if msg is not None else None
            if text and text.strip(". "):
                found.append(("fail_json", _kind_of(node, constants), _clean(text)))
    return found, constants


def imported_utils(source):
    """Names of the collection's module_utils files a source imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == UTILS_PACKAGE:
                names.update(alias.name for alias in node.names)
            elif node.module.startswith(UTILS_PACKAGE + "."):
                names.add(node.module[len(UTILS_PACKAGE) + 1:])
    return names


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def module_faults(root, module):
    """Return [(source file, error class, kind, message)] for one module, its module_utils included."""
    utils_dir = os.path.join(root, "plugins", "module_utils")
    module_path = os.path.join(root, "plugins", "modules", module + ".py")
    order, seen, queue = [], set(), [module_path]
    while queue:
        path = queue.pop(0)
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        order.append(path)
        queue.extend(os.path.join(utils_dir, name + ".py") for name in sorted(imported_utils(_read(path))))
    constants, result, keys = {}, [], set()
    # module_utils first, so their E_* kind constants are known when the module re-raises with them.
    for path in reversed(order):
        faults, constants = faults_in_source(_read(path), constants)
        for error, kind, text in faults:
            if (error, text) not in keys:
                keys.add((error, text))
                result.append((os.path.relpath(path, root), error, kind, text))
    return result


def module_summary(root, module):
    source = _read(os.path.join(root, "plugins", "modules", module + ".py"))
    match = re.search(r"^short_description:\s*(.+)$", source, re.M)
    return match.group(1).strip() if match else ""


def modules(root):
    folder = os.path.join(root, "plugins", "modules")
    return sorted(name[:-3] for name in os.listdir(folder) if name.endswith(".py") and not name.startswith("_"))


def _literal(text):
    return "``%s``" % text.replace("`", "'") if text else ""


def render(root):
    lines = [
        ".. Generated by scripts/gen-troubleshooting.py from the modules' source; do not edit.",
        "",
        ".. _ansible_collections.gpuops.sandbox.docsite.troubleshooting:",
        "",
        "Troubleshooting",
        "===============",
        "",
        "Every failure of a module of this collection ends the task with a message that says what is wrong",
        "and, where the module can tell, what to change. This page lists those messages, per module, as",
        "they appear in the source (``...`` stands for the parts filled in at run time: addresses, paths,",
        "values). Search it for the start of the message a task printed. The error kind, where given, is",
        "also in the task result (``kind``), so a play can tell failures apart without parsing text.",
        "",
        "Messages that end a task before a module runs (wrong option types, missing required options)",
        "come from Ansible's argument validation, and a role's ``assert`` tasks print their own",
        "``fail_msg``; neither is listed here.",
        "",
    ]
    for module in modules(root):
        faults = module_faults(root, module)
        title = "gpuops.sandbox.%s" % module
        lines += [title, "-" * len(title), ""]
        summary = module_summary(root, module)
        if summary:
            lines += [summary.rstrip(".") + ".", ""]
        lines += ["Details: :ansplugin:`%s#module`." % title, ""]
        if not faults:
            lines += ["This module reports no faults of its own.", ""]
            continue
        for source, error, kind, text in faults:
            where = "%s in ``%s``" % (error, source) + (", kind ``%s``" % kind if kind else "")
            lines += ["* %s" % _literal(text), "", "  %s" % where, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    page = render(args.root)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
