"""Tools for running Nezha on one machine: `nezha demo`, `nezha up` and the local origin they use.

They are not parts of a deployment: no cache node, controller or webhook
imports them. They live apart from `cachenode` so that the node package
holds only what runs in a cache pod, while they still ship in the wheel and
the image, because `nezha demo` and `nezha up` are the first commands a
user types.
"""
