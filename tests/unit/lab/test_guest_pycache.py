"""The lab guest's bytecode cache for zipped sources (lab/guest_pycache.py), in a child Python each time so this
process's zipimport stays as it is."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CHILD = textwrap.dedent("""
    import importlib, json, sys, zipimport
    sys.path.insert(0, {lab!r})
    import guest_pycache
    guest_pycache.install({cache!r})
    guest_pycache.install({cache!r})  # a second call does not wrap twice
    calls = []
    original = zipimport._compile_source.original
    def counting(pathname, source):
        calls.append(pathname)
        return original(pathname, source)
    assert hasattr(zipimport._compile_source, 'original')  # the cache's wrapper is in place
    wrapper = guest_pycache.cached_compiler(counting, {cache!r})
    zipimport._compile_source = wrapper
    sys.path.insert(0, {archive!r})
    import payload
    print(json.dumps({{"value": payload.VALUE, "inner": payload.inner_file(), "compiled": calls,
                      "file": payload.__file__}}))
""")


def make_payload(path, value):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload.py", "VALUE = %r\n\ndef inner_file():\n    return inner_file.__code__.co_filename\n"
                         % value)


def run_child(tmp_path, archive):
    script = CHILD.format(lab=os.path.join(TOP, "lab"), cache=str(tmp_path / "cache"), archive=str(archive))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_second_import_of_the_same_source_compiles_nothing_and_names_its_own_zip(tmp_path):
    first_zip, second_zip = tmp_path / "run1.zip", tmp_path / "run2.zip"
    make_payload(first_zip, "one")
    make_payload(second_zip, "one")
    first = run_child(tmp_path, first_zip)
    assert first["value"] == "one" and len(first["compiled"]) == 1
    assert len(os.listdir(tmp_path / "cache")) == 1
    second = run_child(tmp_path, second_zip)
    assert second["value"] == "one"
    assert second["compiled"] == []
    # The cached code names the zip it was imported from this time, down to nested functions.
    assert second["inner"].startswith(str(second_zip)) and second["inner"].endswith("payload.py")


def test_changed_source_is_compiled_again(tmp_path):
    archive = tmp_path / "run.zip"
    make_payload(archive, "one")
    run_child(tmp_path, archive)
    make_payload(archive, "two")
    again = run_child(tmp_path, archive)
    assert again["value"] == "two" and len(again["compiled"]) == 1
    assert len(os.listdir(tmp_path / "cache")) == 2


def test_a_damaged_cache_entry_is_compiled_and_replaced(tmp_path):
    archive = tmp_path / "run.zip"
    make_payload(archive, "one")
    run_child(tmp_path, archive)
    (entry,) = os.listdir(tmp_path / "cache")
    # A power loss can leave an empty or cut file behind.
    for damage in (b"", b"\xe3\x01"):
        (tmp_path / "cache" / entry).write_bytes(damage)
        again = run_child(tmp_path, archive)
        assert again["value"] == "one" and len(again["compiled"]) == 1
    assert (tmp_path / "cache" / entry).stat().st_size > 2


def test_an_unwritable_cache_still_imports(tmp_path):
    (tmp_path / "cache").write_text("a file where the directory should be")
    archive = tmp_path / "run.zip"
    make_payload(archive, "one")
    assert run_child(tmp_path, archive)["value"] == "one"
