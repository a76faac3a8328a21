"""The shared index in Redis: ring membership, object locations, statistics.

One module per job, one Redis client between them:

    schema.py        the key names (a public interface: docs/redis-schema.md)
    connection.py    the client, "no Redis" (disabled) vs "Redis down" (IndexUnavailable), health
    membership.py    the ring: read and watched by everyone, written whole under the controller's fence
    stats_writer.py  a node's counters and object locations, buffered off the data path
    stats_reader.py  what the nodes wrote, for operators, the controller and peers
    embedded.py      the local index of `nezha up` and `nezha demo` when given no Redis
    handle.py        `Index`, the handle a process opens

This file imports nothing, so that the pure schema loads no Redis client.
`Index` is the one handle a process opens (a node, the controller, a CLI
command): it makes the parts over one connection, runs their background
loops and answers each call with the part whose job it is. Nothing here is
awaited on a node's data path.

    Index(redis_url=None)    disabled: no Redis; membership is set locally
    Index(redis_url=...)     "ok" while Redis answers, "degraded" with the
                             reason while it does not, never raising to the
                             data path
"""
