"""Thin wrappers of kernel calls the node's byte paths share (splice(2),
waiting on a descriptor), so fills, the store, the front and port 443 move
bytes without Python touching them."""
