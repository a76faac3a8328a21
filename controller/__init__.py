"""The controller: watches the cache StatefulSet, its pods and Jobs; keeps the ring, the scale and prefetches current."""
