"""A real Prometheus (Debian's `prometheus` package) on 127.0.0.1, scraping static targets.

For the tests and bench/dashboard_picture.py, which ask it the dashboard's
own queries. No persistence beyond its folder; stopped with the test.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp

from testkit.ports import free_port


class Prometheus:
    def __init__(self, exe: str, workdir: Path, *, targets: list[tuple[str, dict[str, str]]],
                 job: str = "nezha-cache", scrape_interval: float = 1.0) -> None:
        """`targets`: (HOST:PORT, labels) pairs, all scraped as `job`."""
        self.exe = exe
        self.workdir = Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval = scrape_interval
        lines = ["global:", f"  scrape_interval: {scrape_interval:g}s", "scrape_configs:",
                 f"  - job_name: {job}", "    static_configs:"]
        for address, labels in targets:
            shown = ", ".join(f"{k}: {v}" for k, v in labels.items())
            lines += [f"      - targets: ['{address}']", f"        labels: {{{shown}}}"]
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None
        self.targets = len(targets)

    async def start(self, *, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(
            [self.exe, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession() as s:
            while loop.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited with {self.proc.returncode}")
                try:
                    async with s.get(f"{self.url}/-/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"prometheus not ready on {self.url} within {timeout:g} s")

    async def scraped(self, session: aiohttp.ClientSession, *, timeout: float = 30.0) -> None:
        """Until every target has been scraped and is up (the first scrape comes seconds after ready)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            up = await self.query(session, "up == 1")
            if len(up) == self.targets:
                return
            await asyncio.sleep(self.scrape_interval / 2)
        raise RuntimeError(f"prometheus had not scraped its {self.targets} targets within {timeout:g} s")

    async def query(self, session: aiohttp.ClientSession, expr: str, *, at: float | None = None) -> list[dict]:
        """An instant query's result vector; RuntimeError naming the expression when Prometheus refuses it."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        async with session.get(f"{self.url}/api/v1/query", params=params) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body.get('error')}")
        return body["data"]["result"]

    async def query_range(self, session: aiohttp.ClientSession, expr: str, *, start: float, end: float,
                          step: float = 2.0) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        async with session.get(f"{self.url}/api/v1/query_range", params=params) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body.get('error')}")
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
