"""The fill engine: one origin exchange per key shared by every client that
wants it (flights), the origin client, and large objects fetched as parallel
byte ranges in slices."""
