"""This node among its peers: the ring view (who owns a key, where peers
listen), copying objects between nodes (replicas, hand-off), invalidating what
a write replaced on every owner, and the one rule that says who is a peer."""
