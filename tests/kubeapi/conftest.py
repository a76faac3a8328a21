from testkit.kubeapi.fixtures import kube, kube_api, kube_target, ns  # noqa: F401
