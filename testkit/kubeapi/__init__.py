"""An in-process double of the Kubernetes API that the real kubernetes-asyncio client talks to.

    api = KubeAPI()            # store + aiohttp app
    await api.start()          # http://127.0.0.1:<port>
    client = api.client()      # kubernetes_asyncio ApiClient pointed at it

See `server.py` for what it implements and where it is simpler than kube-apiserver.
It lives in testkit, not tests/, because bench/controller.py drives the
controller against it too; its own tests are in tests/kubeapi/.
"""

from testkit.kubeapi.server import KubeAPI

__all__ = ["KubeAPI"]
