"""Origin names resolved by asking nameservers, never /etc/hosts (`origin_resolver: dns`).

A sidecar shares its training pod's /etc/hosts, where the webhook mapped
every dataset host to 127.0.0.1, the sidecar itself; a sidecar whose
parent is down must still reach the real origin. So a node with a parent
resolves origin names with the nameservers, search list and ndots of
/etc/resolv.conf (or `origin_nameservers`), over UDP, as the pod's own
resolver would without the hosts file. Names in `system_names` (the
parent's Service name, which kube-dns answers through the usual path
anyway) are resolved the usual way. The message format is
cachenode/fill/dns_message.py's.
"""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from cachenode.fill.dns_message import A, AAAA, DnsError, ResolvConf, addresses, query

RESOLV_CONF = Path("/etc/resolv.conf")


class _Exchange(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.answers: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr) -> None:
        self.answers.put_nowait(data)


class NameserverResolver(AbstractResolver):
    def __init__(self, *, nameservers: list[tuple[str, int]] | None = None, system_names: frozenset[str] = frozenset(),
                 resolv_conf: Path = RESOLV_CONF, timeout: float = 2.0) -> None:
        """`nameservers` ((host, port) pairs) replace those of `resolv_conf`,
        whose search list and ndots still apply. Each nameserver gets
        `timeout` seconds per question."""
        try:
            conf = ResolvConf(resolv_conf.read_text())
        except OSError:
            conf = ResolvConf("")
        self._conf = conf
        self._servers = nameservers if nameservers is not None else [(ns, 53) for ns in conf.nameservers]
        self._system_names = system_names
        self._timeout = timeout
        self._system: ThreadedResolver | None = None

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host in self._system_names:
            if self._system is None:
                self._system = ThreadedResolver()
            return await self._system.resolve(host, port, family)
        qtypes = [AAAA] if family == socket.AF_INET6 else [A] if family == socket.AF_INET else [A, AAAA]
        problems = []
        for name in self._conf.candidates(host):
            for qtype in qtypes:
                try:
                    found = await self._ask(name, qtype)
                except DnsError as e:
                    problems.append(f"{name}: {e}")
                    continue
                if found:
                    return [ResolveResult(hostname=host, host=ip, port=port,
                                          family=socket.AF_INET6 if qtype == AAAA else socket.AF_INET,
                                          proto=0, flags=socket.AI_NUMERICHOST) for ip in found]
        servers = ", ".join(f"{h}:{p}" for h, p in self._servers) or "none in /etc/resolv.conf"
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: no address from the nameservers ({servers}), "
                                                 f"which are asked instead of /etc/hosts; {'; '.join(problems)[:300]}")

    async def _ask(self, name: str, qtype: int) -> list[str]:
        """The addresses the first nameserver that answers gives; DnsError if none does."""
        loop = asyncio.get_running_loop()
        last: DnsError = DnsError("no nameserver")
        for server in self._servers:
            ident = random.getrandbits(16)
            try:
                transport, exchange = await loop.create_datagram_endpoint(_Exchange, remote_addr=server)
            except OSError as e:
                last = DnsError(f"nameserver {server[0]}:{server[1]}: {e}")
                continue
            try:
                transport.sendto(query(name, qtype, ident))
                async with asyncio.timeout(self._timeout):
                    while True:
                        try:
                            return addresses(await exchange.answers.get(), ident=ident, qtype=qtype)
                        except DnsError as e:
                            if str(e) != "not the answer to this query":
                                raise
            except TimeoutError:
                last = DnsError(f"nameserver {server[0]}:{server[1]} did not answer within {self._timeout:g}s")
            except DnsError as e:
                if "NXDOMAIN" in str(e):
                    raise  # an authoritative "no": the next server would say the same
                last = DnsError(f"nameserver {server[0]}:{server[1]}: {e}")
            finally:
                transport.close()
        raise last

    async def close(self) -> None:
        if self._system is not None:
            await self._system.close()
