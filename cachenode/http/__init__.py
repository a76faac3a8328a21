"""HTTP semantics of a shared cache, pure: what may be stored, for how long, which
stored variant a request selects, which header fields cross, and how conditional
and Range requests are answered from a stored object (RFC 9110, 9111, 5861).
No I/O: the front and the fill engine ask, these modules answer."""
