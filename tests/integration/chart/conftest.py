"""Chart tests: the API double for the ones that install."""

from testkit.kubeapi.fixtures import kube_api, kube_target  # noqa: F401 - fixtures, used by name
