"""Which node a peer passing a chunk on reads it from (cachenode/chunks/feeders.py): the nodes asking an
owner for a chunk while it sends it form a chain (a heap of degree `fanout`) in the order they came, unless
the object's leads are even enough that each owner answers every asker itself (a star)."""

from __future__ import annotations

import pytest

from cachenode.chunks.feeders import Feeders, fanout_for, star

CKEY = "http://h/x#chunk/1048576/3"


def test_the_first_node_asking_is_answered_by_the_owner():
    assert Feeders().feeder_for(CKEY, "n1", fanout=1) is None


def test_nodes_asking_while_the_owner_sends_the_chunk_form_a_chain_in_the_order_they_came():
    feeders = Feeders()
    feeders.sending(CKEY, "n1")  # the owner answers n1 itself
    assert [feeders.feeder_for(CKEY, n, fanout=1) for n in ("n2", "n3", "n4")] == ["n1", "n2", "n3"]
    assert feeders.running(CKEY) == ["n1", "n2", "n3", "n4"]


def test_with_a_fanout_of_two_the_nodes_form_a_heap_each_feeding_at_most_two():
    feeders = Feeders()
    feeders.sending(CKEY, "n1")
    got = [feeders.feeder_for(CKEY, n, fanout=2) for n in ("n2", "n3", "n4", "n5", "n6")]
    assert got == ["n1", "n1", "n2", "n2", "n3"]


def test_a_node_already_in_the_wave_is_answered_by_the_owner_so_no_two_nodes_wait_on_each_other():
    feeders = Feeders()
    feeders.sending(CKEY, "n1")
    assert feeders.feeder_for(CKEY, "n2", fanout=1) == "n1"
    assert feeders.feeder_for(CKEY, "n1", fanout=1) is None, "n1 asks again: its first flight ended"
    assert feeders.feeder_for(CKEY, "n2", fanout=1) is None, "n2 could not be fed by n1: the owner answers it"


def test_a_wave_ends_with_the_last_answer_the_owner_sends_and_the_next_node_starts_a_new_one():
    feeders = Feeders()
    feeders.sending(CKEY, "n1")
    feeders.sending(CKEY, "n2")  # an owner's fill copying the chunk, answered too
    assert feeders.feeder_for(CKEY, "n3", fanout=1) == "n1"
    feeders.sent(CKEY)
    assert feeders.feeder_for(CKEY, "n4", fanout=1) == "n2", "one answer still runs: the wave goes on"
    feeders.sent(CKEY)
    assert feeders.running(CKEY) == []
    assert feeders.feeder_for(CKEY, "n5", fanout=1) is None


def test_waves_of_different_chunks_are_apart():
    feeders = Feeders()
    feeders.sending(CKEY, "n1")
    assert feeders.feeder_for(CKEY.replace("/3", "/4"), "n2", fanout=1) is None


@pytest.mark.parametrize("nodes, fanout", [(2, 1), (8, 1), (16, 1), (17, 2), (64, 2)])
def test_a_wave_is_a_chain_up_to_sixteen_nodes_and_a_heap_of_degree_two_beyond(nodes, fanout):
    assert fanout_for(nodes) == fanout


@pytest.mark.parametrize("chunks, nodes", [(8, 8), (8, 4), (8, 2), (16, 16), (64, 8), (16, 4), (8, 3), (8, 5),
                                           (16, 17), (1, 1)])
def test_an_object_whose_leads_are_even_within_the_slack_is_sent_by_each_owner_to_every_asker(chunks, nodes):
    """ceil(C / N) leads on a node, each sent to N - 1 others, is within 1.25 x the even C·(N - 1)/N."""
    assert star(chunks, nodes)


@pytest.mark.parametrize("chunks, nodes", [(8, 16), (16, 32), (2, 4), (3, 4), (8, 6), (8, 7), (1, 2)])
def test_an_object_with_fewer_chunks_than_nodes_or_a_lopsided_remainder_is_passed_in_waves(chunks, nodes):
    """A star there would load the busiest owner's link more than 1.25 x the even share: a node leading
    one chunk of 8 on 16 nodes sends it 15 times where the even share is 7.5."""
    assert not star(chunks, nodes)
