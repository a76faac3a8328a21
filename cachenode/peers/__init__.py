"""A node's asks of its peers, and who counts as one.

  asks   asking one peer: its connect budget, down marks, liveness probes, body guards
  auth   who is a peer: the cluster token, or loopback for a lone node

It sits between `fill` and `store` (pyproject.toml's layers): the relay
(front/relay.py), chunk reads (chunks/) and a fill led through a peer
(fill/running.py) all ask peers through `PeerAsks`, and hand-off and the
front check who is a peer. Below them all, each of those calls goes down.
"""
