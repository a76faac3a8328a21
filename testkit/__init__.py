"""What the tests and the benchmarks need to stand up real things on this machine.

One copy of each helper instead of one per test folder and benchmark script:
free ports on 127.0.0.1 (`ports`), waiting for a process to answer on its
port or URL (`waits`), a real redis-server (`redis_server`), the rule for a
missing tool (`tools`), the Kubernetes API double (`kubeapi`), hosts in
network namespaces behind shaped links (`netns`, as root), a distance in
front of a server (`delayline`, a relay in C: this kernel has no netem) and a stampede
of clients through a cluster on such a network (`stampede`).

Not part of the installed package (pyproject's package list leaves it out):
pytest finds it through `pythonpath = ["."]`, bench scripts put the
repository root on sys.path. pytest fixtures stay in conftest.py files and
are built on these modules.
"""
