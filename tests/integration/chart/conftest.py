"""Chart tests: the API double for the ones that install."""

from tests.kubeapi.fixtures import kube_api, kube_target  # noqa: F401 - fixtures, used by name
