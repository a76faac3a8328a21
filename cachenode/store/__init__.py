"""The node's disk: complete objects only, named by key hash, written through a
temp file and started on their way to disk while they fill."""
