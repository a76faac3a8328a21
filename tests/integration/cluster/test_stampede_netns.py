"""A small stampede on a simulated network (issue 38): six clients read one cold 4 MiB object at the same moment
through three `nezha cache` processes, each node, the origin, Redis and each group of clients in a network
namespace of its own behind a shaped link (testkit/stampede.py). Every client gets exact bytes, and the origin
sends the object about once. The timing curve is bench/stampede.py's, not this test's."""

from __future__ import annotations

import pytest

from testkit.netns import NetnsUnavailable, check_available
from testkit.stampede import Scene, run
from testkit.tools import require_tool, unavailable

MiB = 1 << 20


@pytest.fixture
def namespaces_possible():
    try:
        check_available()
    except NetnsUnavailable as e:
        unavailable(str(e))
    require_tool("redis-server")


@pytest.mark.usefixtures("namespaces_possible")
@pytest.mark.parametrize("config", ["plain", "shipped"])
def test_six_clients_at_once_through_three_nodes_get_exact_bytes_and_the_origin_sends_it_once(config, tmp_path):
    size = 4 * MiB
    outcome = run(Scene(config=config, nodes=3, clients=6, size=size, node_rate=8_000_000, origin_rate=8_000_000,
                        timeout=120), tmp_path)
    assert len(outcome.clients) == 6
    assert outcome.exact == 6, [(c["group"], c["status"], c["bytes"], c["label"]) for c in outcome.clients]
    assert outcome.origin_bytes <= 1.02 * size, (outcome.origin_bytes, outcome.origin_requests)
    # The links carried it: the key's owner sent the object to others, not just loopback inside one host.
    assert outcome.link_bytes[outcome.owner][0] >= 2 * size
    # The samples behind those counts are kept, from the release on, for a trace of where the time went.
    (first_at, first), (last_at, last) = outcome.link_series[0], outcome.link_series[-1]
    assert first_at < last_at
    assert last[outcome.owner][0] - first[outcome.owner][0] == outcome.link_bytes[outcome.owner][0]
