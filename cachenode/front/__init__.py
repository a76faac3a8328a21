"""The request front: everything that answers a client. The listener and its
connections (limits, head timeouts), plain hits answered below aiohttp (the
fast path), the writers of every response (sendfile from disk, a growing fill,
a pass-through copy), and the relay that answers through a key's owner."""
