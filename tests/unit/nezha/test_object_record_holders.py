"""An object's record names its holders in fields of their own; every other field is no holder."""

import pytest

from nezha.index.schema import holders, node_field


@pytest.mark.parametrize("fields, expected", [
    ([], set()),
    (["url", "size", "stored_at", "last_access"], set()),
    (["url", node_field("nezha-cache-0")], {"nezha-cache-0"}),
    ([b"size", b"node:nezha-cache-1", b"node:nezha-cache-2"], {"nezha-cache-1", "nezha-cache-2"}),
    ({"node:a": "1", "nodes": "x", "last_access": "1"}, {"a"}),
])
def test_holders_are_the_node_fields_of_an_object_record(fields, expected):
    assert holders(fields) == expected
