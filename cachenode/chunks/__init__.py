"""Chunked objects: a large object stored as chunks spread over the ring.

An object at least `chunk_threshold` long is stored as chunks (nezha/chunks.py
says which bytes each holds, under which key and on which nodes). The owner
of the object's key stores a manifest (`Meta.chunk_size`, `Meta.length`, the
origin's headers, an empty data file; fill/engine.py); each chunk is an
object of its own on the owners of its chunk key.

The room's modules, one job each:

  spec     what a peer's chunk request names (`ChunkSpec`), the version every chunk is of
  sources  where one piece of a read comes from; a chunk read as it is written
  peers    a chunk's owners, and the two chunk requests a node makes of them (ask, push)
  fills    one fill per chunk per node, on the single-flight of every fill (fill/flights.py)
  adopted  chunk 0 from a cold fill's first answer, stored where it landed, copied by its owners
  reads    a chunked object read for a client, chunk by chunk: the body source
  owner    the owner's side: answering a peer's request for one chunk
  peers_first  this node's clients of an object kept behind the peers reading its chunks from here
  feeders  which node a peer passing a chunk on reads it from: a chain of those reading it at once
  copies   hand-off of chunks when a node leaves, and dropping chunks no manifest names

It sits between `cluster` and `fill` (pyproject.toml's layers): the fill
engine, hand-off and invalidation are handed what they use of it, and what
it uses of the rooms above (invalidation's broadcast and `forget`) is handed
to it as protocols. The peer asks, the ring view and the file sender it is
handed sit below it (cachenode/peers/, cluster_view.py, kernel/sendfile.py).
"""
