"""Unit tests for the www_authenticate filter (registry authentication challenges)."""

import pytest

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.sandbox.plugins.filter.www_authenticate import FilterModule, parse_www_authenticate


@pytest.mark.parametrize("header, expected", [
    ('Basic realm="basic-realm"', {"scheme": "basic", "params": {"realm": "basic-realm"}}),
    ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
     'scope="repository:library/busybox:pull"',
     {"scheme": "bearer", "params": {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                                     "scope": "repository:library/busybox:pull"}}),
    ('BEARER Realm = "https://h/t" , Service=harbor', {"scheme": "bearer",
                                                       "params": {"realm": "https://h/t", "service": "harbor"}}),
    ('Basic realm="a \\"quoted\\" realm"', {"scheme": "basic", "params": {"realm": 'a "quoted" realm'}}),
    ("Negotiate", {"scheme": "negotiate", "params": {}}),
    ('Basic realm="one", Bearer realm="two"', {"scheme": "basic", "params": {"realm": "one"}}),
    ("", {"scheme": "", "params": {}}),
    (None, {"scheme": "", "params": {}}),
    (b'Basic realm="r"', {"scheme": "basic", "params": {"realm": "r"}}),
])
def test_parse(header, expected):
    assert parse_www_authenticate(header) == expected


@pytest.mark.parametrize("header", [42, ["Basic"], {"scheme": "basic"}])
def test_rejects_non_strings(header):
    with pytest.raises(AnsibleFilterError, match="expects a string"):
        parse_www_authenticate(header)


def test_rejects_garbage():
    with pytest.raises(AnsibleFilterError, match="not a WWW-Authenticate challenge"):
        parse_www_authenticate('"quoted"')


def test_registered():
    assert FilterModule().filters()["www_authenticate"] is parse_www_authenticate
