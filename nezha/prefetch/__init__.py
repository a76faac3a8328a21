"""Prefetch by name: what `nezha.io/prefetch` may name, and the listings a name expands through."""
