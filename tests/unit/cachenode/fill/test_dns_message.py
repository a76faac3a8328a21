"""DNS messages a node with a parent uses to find origins without /etc/hosts (cachenode/fill/dns_message.py)."""

from __future__ import annotations

import struct

import pytest

from cachenode.fill.dns_message import A, AAAA, DnsError, ResolvConf, addresses, query


def name(text: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in text.split(".")) + b"\0"


def answer(ident: int, *, question: str = "www.example.org", qtype: int = A, records=(), flags: int = 0x8180) -> bytes:
    """A recursive server's answer: the question, then records (name bytes, type, rdata)."""
    out = struct.pack("!HHHHHH", ident, flags, 1, len(records), 0, 0) + name(question) + struct.pack("!HH", qtype, 1)
    for owner, rtype, rdata in records:
        out += owner + struct.pack("!HHIH", rtype, 1, 300, len(rdata)) + rdata
    return out


def test_a_query_asks_one_question_with_recursion_desired():
    assert query("www.example.org", A, 0x1234) == (
        struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + name("www.example.org") + struct.pack("!HH", 1, 1))
    assert query("www.example.org.", AAAA, 7).endswith(name("www.example.org") + struct.pack("!HH", 28, 1))


@pytest.mark.parametrize("bad", ["", "a..b", "x" * 64 + ".org"])
def test_a_name_that_is_not_one_is_refused_before_anything_is_sent(bad):
    with pytest.raises(DnsError):
        query(bad, A, 1)


def test_the_addresses_of_an_answer_follow_a_cname_chain_and_compressed_names():
    cname_target = name("s3-1-w.amazonaws.com")
    records = [(b"\xc0\x0c", 5, cname_target),  # pointer to the question's name, CNAME
               (b"\xc0\x2d", A, bytes([52, 216, 1, 2])),  # pointer into the CNAME's target
               (b"\xc0\x2d", A, bytes([52, 216, 3, 4]))]
    assert addresses(answer(9, records=records), ident=9, qtype=A) == ["52.216.1.2", "52.216.3.4"]


def test_aaaa_records_are_read_only_for_an_aaaa_question():
    records = [(b"\xc0\x0c", AAAA, bytes(15) + b"\x01"), (b"\xc0\x0c", A, bytes([10, 0, 0, 1]))]
    assert addresses(answer(3, qtype=AAAA, records=records), ident=3, qtype=AAAA) == ["::1"]
    assert addresses(answer(3, records=records), ident=3, qtype=A) == ["10.0.0.1"]


@pytest.mark.parametrize("data, message", [
    (answer(1, flags=0x8183), "NXDOMAIN"),
    (answer(1, flags=0x8182), "rcode 2"),
    (answer(1, flags=0x8380), "truncated"),
    (answer(2), "not the answer"),
    (answer(1, flags=0x0100), "not the answer"),  # a query, not a response
    (b"\x00\x01", "shorter than its header"),
    (answer(1, records=[(b"\xc0\x0c", A, b"\x01\x02\x03\x04")])[:-2], "ends inside"),
])
def test_an_answer_naming_no_address_is_an_error_saying_why(data, message):
    with pytest.raises(DnsError, match=message):
        addresses(data, ident=1, qtype=A)


def test_resolv_conf_gives_nameservers_search_list_and_ndots_as_libc_reads_them():
    conf = ResolvConf("# kubelet\nsearch ml.svc.cluster.local svc.cluster.local cluster.local\n"
                      "nameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver bogus\nnameserver 1.1.1.1\n"
                      "nameserver 8.8.8.8\noptions ndots:5 timeout:1\n")
    assert conf.nameservers == ["10.96.0.10", "fe80::1", "1.1.1.1"]
    assert conf.ndots == 5
    # A name with fewer dots than ndots is tried under the search domains first.
    assert conf.candidates("minio.storage") == ["minio.storage.ml.svc.cluster.local", "minio.storage.svc.cluster.local",
                                                "minio.storage.cluster.local", "minio.storage"]
    assert conf.candidates("www.cs.toronto.edu.") == ["www.cs.toronto.edu"]
    plain = ResolvConf("nameserver 127.0.0.53\nsearch corp.example\n")
    assert plain.candidates("www.cs.toronto.edu") == ["www.cs.toronto.edu", "www.cs.toronto.edu.corp.example"]
    assert ResolvConf("").nameservers == []
