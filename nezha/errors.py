"""The exception tree shared by every Nezha component.

    NezhaError
    ├── ConfigError        settings that cannot work together; named fields (exit 2)
    ├── RunError           a run-time failure a user can act on, such as a port in use (exit 1)
    ├── OriginError        the origin could not be reached or answered badly
    │   └── OriginTimeout  the origin did not answer in time
    ├── FillAborted        a fill stopped before the object was complete
    ├── StoreError         the disk store failed at a named step
    ├── AnnotationError    an invalid nezha.io/* annotation (controller)
    └── ReviewError        a malformed AdmissionReview (webhook)

Messages say what failed, for which key or object, and the value seen.
"""


class NezhaError(Exception):
    """Base of every error Nezha raises on purpose."""


class ConfigError(NezhaError):
    """Bad settings: the command exits 2 before it binds or writes anything."""


class RunError(NezhaError):
    """A failure at run time the user can act on (a port in use): one line, exit 1, no traceback."""


class OriginError(NezhaError):
    pass


class OriginTimeout(OriginError):
    pass


class FillAborted(NezhaError):
    pass


class StoreError(NezhaError):
    pass


class AnnotationError(NezhaError):
    pass


class ReviewError(NezhaError):
    pass
