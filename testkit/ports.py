"""Free TCP ports on 127.0.0.1, for servers that must be told their port.

One copy, in the shipped package (nezha/localproc.py), which `nezha up`,
`nezha demo` and the embedded index use too; re-exported here for the tests
and benchmarks. A server that can bind port 0 and report what it got should
do that instead. A port is free when asked, and another process may take it
before the server binds it: the window is small, and a test that loses it
fails naming the port rather than passing by accident.
"""

from __future__ import annotations

from nezha.localproc import HOST, free_port, free_run, is_free

__all__ = ["HOST", "free_port", "free_run", "is_free"]
