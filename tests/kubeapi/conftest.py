from tests.kubeapi.fixtures import kube, kube_api  # noqa: F401
