"""The cache StatefulSet's `nezha.io/*` annotations -> the controller's Spec. Pure: no I/O.

Annotations are the controller's only user-facing configuration, and they
are edited by hand while the controller runs, so a typo must never take
the cluster down or silently change it. `read_spec` therefore never raises:

- An annotation that is absent gives the field its default. Removing an
  annotation is how a user says "back to the default", so the previous
  value is *not* kept.
- An annotation that is present but invalid keeps the value in force
  (`last`, the Spec of the previous read) for that field alone and yields a
  `Problem`, whose message names the full key, the value seen and what was
  kept; the caller turns it into a Warning Event. An empty value is
  invalid, not absent.
- Values are strict: integers are ASCII decimal digits (no sign, no
  suffix); quantities are decimal numbers with an optional `k`, `K`, `M` or
  `G` suffix (powers of 1000). Lowercase `m` is refused because Kubernetes
  quantities read it as milli (and a delay of "5m" was surely meant as
  minutes); exponents, signs, `nan` and `inf` are refused too. Durations are
  in seconds.

Cross-field rules, applied to the values in force after the per-field step:

- `min-replicas` > `max-replicas` keeps the previous min *and* max (one
  Problem naming both keys): moving one bound alone could leave a pair that
  was never asked for.
- `autoscale: "true"` needs a target (`target-bytes-per-second`) and an
  upper bound (`max-replicas`): without a target there is nothing to aim at,
  and without a bound a load spike could scale the StatefulSet without
  limit. Missing either, autoscaling stays off and one Problem names
  `nezha.io/autoscale` and the missing keys. A missing `min-replicas`
  defaults to 1 when autoscaling is on. A target or max that was invalid
  but had a valid previous value is in force, so it counts as set.

Invariants of a returned Spec: `min_replicas <= max_replicas` when both are
set; `autoscale` implies `target_bytes_per_second`, `min_replicas` and
`max_replicas` are all set.

Unknown `nezha.io/` keys are ignored, but one within edit distance 2 of a
known key (compared case-insensitively, since keys are case-sensitive and
`Min-Replicas` is a likely slip) is reported as a probable typo. Keys other
parts of Nezha write or read (`status`, `prefetch`, `prefetch-status`,
`injected`, the webhook's `inject`) are never reported.

`parse_prefetch` reads a workload's `nezha.io/prefetch` list the same way: bad
entries are dropped, each with a Problem, and the rest are used. An entry
is an object's URL or a name (`hf://`, `s3://`, an index page, a manifest:
nezha/prefetch/names.py); `secret_problem` checks `nezha.io/prefetch-secret`,
`read_keep` reads `nezha.io/prefetch-keep`, `read_spread` `nezha.io/prefetch-spread`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from nezha import errors
from nezha.prefetch.names import BadName, parse_name

PREFIX = "nezha.io/"
AUTOSCALE = "nezha.io/autoscale"
MIN_REPLICAS = "nezha.io/min-replicas"
MAX_REPLICAS = "nezha.io/max-replicas"
TARGET = "nezha.io/target-bytes-per-second"
SCALE_DOWN_DELAY = "nezha.io/scale-down-delay"
SCALE_WINDOW = "nezha.io/scale-window"
SCALE_COOLDOWN = "nezha.io/scale-cooldown"
REPLICAS_PER_KEY = "nezha.io/replicas-per-key"
PREFETCH = "nezha.io/prefetch"
PREFETCH_STATUS = "nezha.io/prefetch-status"
PREFETCH_SECRET = "nezha.io/prefetch-secret"
PREFETCH_KEEP = "nezha.io/prefetch-keep"
PREFETCH_SPREAD = "nezha.io/prefetch-spread"

# Written by the controller or read by the webhook: present on purpose, never a typo.
OTHER_KEYS = frozenset({"nezha.io/status", PREFETCH, PREFETCH_STATUS, PREFETCH_SECRET, PREFETCH_KEEP,
                        PREFETCH_SPREAD, "nezha.io/injected", "nezha.io/inject"})

MAX_COUNT = 2**31 - 1  # StatefulSet replicas is an int32
MAX_URL_LENGTH = 8192
MAX_URLS = 1000
NEAR_MISS_DISTANCE = 2


@dataclass(frozen=True)
class Spec:
    """What the StatefulSet's annotations ask of the controller; the defaults are an unannotated StatefulSet."""

    autoscale: bool = False
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_bytes_per_second: float | None = None
    scale_down_delay: float = 300.0
    scale_window: float = 30.0
    scale_cooldown: float = 60.0
    replicas_per_key: int | None = None


DEFAULT = Spec()


@dataclass(frozen=True)
class Problem:
    """One invalid annotation (or pair), worded for a Warning Event: the message is a single line."""

    keys: tuple[str, ...]
    value: str
    message: str


class AnnotationError(errors.AnnotationError, ValueError):
    """One Problem as an exception, for callers that want to stop on the first.

    `read_spec` never raises it. It is a `nezha.errors.AnnotationError` (so a
    `NezhaError`) and a `ValueError`, so either kind of handler catches it.
    """

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


# --- values -----------------------------------------------------------------

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)([kKMG]?)")
_COUNT = re.compile(r"[0-9]+")
_MULTIPLIER = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
_SHOWN_CHARS = 200


def _quote(text: str) -> str:
    """`text` in double quotes on one line: anything not printable is escaped, so
    a stray newline or a no-break space is visible and cannot split the Event."""
    shown = text[:_SHOWN_CHARS]
    out = []
    for c in shown:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
    more = f"… ({len(text)} chars)" if len(text) > _SHOWN_CHARS else ""
    return f'"{"".join(out)}"{more}'


def parse_quantity(text: str) -> float:
    """A non-negative decimal with an optional k/K/M/G suffix (powers of 1000): "1.5G" -> 1.5e9.

    Raises ValueError naming the text. Surrounding whitespace is ignored.
    """
    stripped = text.strip()
    m = _QUANTITY.fullmatch(stripped)
    if m is None:
        if stripped.startswith("-") and _QUANTITY.fullmatch(stripped[1:]):
            raise ValueError(f"{_quote(text)} is negative")
        if stripped.endswith("m") and _QUANTITY.fullmatch(stripped[:-1]):
            raise ValueError(f'{_quote(text)} ends in "m", which Kubernetes reads as milli; '
                             "use k, M or G (powers of 1000), or plain seconds for a duration")
        raise ValueError(f"{_quote(text)} is not a number with an optional k, M or G suffix")
    value = float(m.group(1)) * _MULTIPLIER[m.group(2)]
    if not math.isfinite(value):
        raise ValueError(f"{_quote(text)} is too large")
    return value


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise ValueError(f'{_quote(text)} is not "true" or "false"')
    return word == "true"


def _parse_count(text: str) -> int:
    """A whole number from 1 to the int32 limit; the only shape a replica count can take."""
    digits = text.strip()
    if not _COUNT.fullmatch(digits):
        raise ValueError(f"{_quote(text)} is not a whole number")
    # Check the length first: int() of thousands of digits is slow, then refused.
    if len(digits.lstrip("0")) > len(str(MAX_COUNT)) or int(digits) > MAX_COUNT:
        raise ValueError(f"{_quote(text)} is more than {MAX_COUNT}")
    if int(digits) < 1:
        raise ValueError(f"{_quote(text)} is less than 1")
    return int(digits)


def _parse_positive(text: str) -> float:
    value = parse_quantity(text)
    if value <= 0:
        raise ValueError(f"{_quote(text)} is not greater than 0")
    return value


def _parse_non_negative(text: str) -> float:
    return parse_quantity(text)  # refuses a sign, so never negative


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _kept(attr: str, value: object) -> str:
    """How a message says what stays in force: "keeping 2", "keeping the default 300"."""
    if value is None:
        return "keeping it unset"
    if value == getattr(DEFAULT, attr):
        return f"keeping the default {_show(value)}"
    return f"keeping {_show(value)}"


# --- the StatefulSet --------------------------------------------------------

@dataclass(frozen=True)
class _Field:
    key: str
    attr: str
    parse: Callable[[str], object]  # raises ValueError whose message names the value


_FIELDS = (
    _Field(AUTOSCALE, "autoscale", _parse_bool),
    _Field(MIN_REPLICAS, "min_replicas", _parse_count),
    _Field(MAX_REPLICAS, "max_replicas", _parse_count),
    _Field(TARGET, "target_bytes_per_second", _parse_positive),
    _Field(SCALE_DOWN_DELAY, "scale_down_delay", _parse_non_negative),
    _Field(SCALE_WINDOW, "scale_window", _parse_positive),
    _Field(SCALE_COOLDOWN, "scale_cooldown", _parse_non_negative),
    _Field(REPLICAS_PER_KEY, "replicas_per_key", _parse_count),
)
KNOWN_KEYS = tuple(f.key for f in _FIELDS)


def read_spec(annotations: Mapping[str, str] | None, *, last: Spec = DEFAULT) -> tuple[Spec, list[Problem]]:
    """The Spec the annotations ask for, and what was wrong with them (sorted by keys).

    `last` is the Spec returned by the previous read; an invalid value keeps
    its field. Never raises.
    """
    annotations = annotations or {}
    values: dict[str, object] = {}
    problems: list[Problem] = []

    for f in _FIELDS:
        if f.key not in annotations:
            values[f.attr] = getattr(DEFAULT, f.attr)
            continue
        raw = annotations[f.key]
        try:
            if not isinstance(raw, str):
                raise ValueError(f"{raw!r} is not a string")
            values[f.attr] = f.parse(raw)
        except ValueError as e:
            kept = getattr(last, f.attr)
            values[f.attr] = kept
            problems.append(Problem((f.key,), str(raw), f"{f.key}: {e}; {_kept(f.attr, kept)}"))

    low, high = values["min_replicas"], values["max_replicas"]
    if low is not None and high is not None and low > high:
        kept_low, kept_high = last.min_replicas, last.max_replicas
        if kept_low is not None and kept_high is not None and kept_low > kept_high:
            kept_low = kept_high = None  # a `last` not made here; never return a crossed pair
        values["min_replicas"], values["max_replicas"] = kept_low, kept_high
        kept = ("keeping both unset" if kept_low is None and kept_high is None
                else f"keeping {_show(kept_low) if kept_low is not None else 'no minimum'} "
                     f"and {_show(kept_high) if kept_high is not None else 'no maximum'}")
        problems.append(Problem((MIN_REPLICAS, MAX_REPLICAS), f"{low} > {high}",
                                f"{MIN_REPLICAS} ({low}) is greater than {MAX_REPLICAS} ({high}); {kept}"))

    if values["autoscale"]:
        missing = tuple(key for key, attr in ((TARGET, "target_bytes_per_second"), (MAX_REPLICAS, "max_replicas"))
                        if values[attr] is None)
        if missing:
            values["autoscale"] = False
            raw = annotations.get(AUTOSCALE)
            seen = raw if isinstance(raw, str) else "true"
            problems.append(Problem((AUTOSCALE, *missing), seen,
                                    f"{AUTOSCALE}: {_quote(seen)} needs {' and '.join(missing)}; "
                                    "autoscaling stays off"))
        elif values["min_replicas"] is None:
            values["min_replicas"] = 1

    for key in sorted(k for k in annotations if isinstance(k, str)):
        if not key.startswith(PREFIX) or key in KNOWN_KEYS or key in OTHER_KEYS:
            continue
        guesses = _near_misses(key)
        if guesses:
            problems.append(Problem((key,), str(annotations[key]),
                                    f"unknown annotation {key}: did you mean {' or '.join(guesses)}? ignored"))

    problems.sort(key=lambda p: (p.keys, p.value, p.message))
    return Spec(**values), problems  # type: ignore[arg-type]


def _near_misses(key: str) -> list[str]:
    """The known keys closest to `key`, if any is within NEAR_MISS_DISTANCE."""
    scored = [(_distance(key.lower(), known), known) for known in KNOWN_KEYS]
    best = min(d for d, _ in scored)
    if best > NEAR_MISS_DISTANCE:
        return []
    return sorted(known for d, known in scored if d == best)


def _distance(a: str, b: str) -> int:
    """Levenshtein distance; gives up early (returning a bound) once it must exceed NEAR_MISS_DISTANCE."""
    if abs(len(a) - len(b)) > NEAR_MISS_DISTANCE:
        return NEAR_MISS_DISTANCE + 1
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > NEAR_MISS_DISTANCE:
            return NEAR_MISS_DISTANCE + 1
        previous = current
    return previous[-1]


# --- a Job's prefetch list --------------------------------------------------

_BAD_CHAR = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def parse_prefetch(value: str | None) -> tuple[list[str], list[Problem]]:
    """The entries of a workload's `nezha.io/prefetch` (comma-separated), de-duplicated in order.

    Each is an `hf://` or `s3://` name (nezha/prefetch/names.py), or an
    absolute http(s) URL with a host, no userinfo (a
    credential in an annotation is readable by anyone who can read the Job),
    no whitespace or control characters, at most MAX_URL_LENGTH characters.
    Bad ones are dropped with a Problem each; past MAX_URLS the rest are
    dropped with one Problem.
    """
    if not value:
        return [], []
    entries = list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    urls: list[str] = []
    problems: list[Problem] = []
    for url in entries:
        why = _url_problem(url)
        if why is None:
            urls.append(url)
        else:
            problems.append(Problem((PREFETCH,), url, f"{PREFETCH}: {_quote(url)} {why}; not prefetched"))
    if len(urls) > MAX_URLS:
        problems.append(Problem((PREFETCH,), f"{len(urls)} URLs",
                                f"{PREFETCH}: {len(urls)} URLs is more than {MAX_URLS}; "
                                f"prefetching the first {MAX_URLS}, dropping from {_quote(urls[MAX_URLS])}"))
        urls = urls[:MAX_URLS]
    return urls, problems


def _url_problem(url: str) -> str | None:
    """Why `url` cannot be prefetched, or None if it can."""
    if len(url) > MAX_URL_LENGTH:
        return f"is longer than {MAX_URL_LENGTH} characters"
    if _BAD_CHAR.search(url):
        return "contains whitespace or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number in range
    except ValueError as e:
        return f"is not a valid URL ({e})"
    if parts.scheme.lower() in ("hf", "s3"):
        try:
            parse_name(url)
        except BadName as e:
            return str(e)
        return None
    if parts.scheme.lower() not in ("http", "https"):
        return "is not an http:// or https:// URL, nor an hf:// or s3:// name"
    if "@" in parts.netloc:
        return "has userinfo (user@); put no credentials in an annotation"
    if not parts.hostname:
        return "has no host"
    return None


# --- a workload's prefetch Secret ---------------------------------------------

_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def secret_problem(value: str | None) -> Problem | None:
    """Why `nezha.io/prefetch-secret` names no Secret (a Kubernetes object name: a DNS subdomain), or None."""
    name = (value or "").strip()
    if _SECRET_NAME.fullmatch(name):
        return None
    return Problem((PREFETCH_SECRET,), str(value), f"{PREFETCH_SECRET}: {_quote(str(value))} is not a Secret name "
                                                   "(lowercase letters, digits, '-' and '.')")


KEEP_DEFAULT = 3600.0  # seconds a workload's pins hold after it is deleted


def read_keep(value: str | None) -> tuple[float, Problem | None]:
    """`nezha.io/prefetch-keep`: seconds (a non-negative number, k/M/G allowed) a deleted workload's
    prefetched objects stay pinned; absent: KEEP_DEFAULT. An invalid value keeps the default, with a Problem."""
    if value is None:
        return KEEP_DEFAULT, None
    try:
        return _parse_non_negative(value), None
    except ValueError as e:
        return KEEP_DEFAULT, Problem((PREFETCH_KEEP,), value, f"{PREFETCH_KEEP}: {e}; keeping the default "
                                                               f"{_show(KEEP_DEFAULT)} seconds")


def read_spread(value: str | None) -> tuple[bool, Problem | None]:
    """`nezha.io/prefetch-spread`: `all` copies each prefetched object to every node, as a hot copy;
    absent or `none`: the owners alone hold it. Anything else is a Problem, and spreads nothing."""
    word = (value or "none").strip().lower()
    if word in ("all", "none"):
        return word == "all", None
    return False, Problem((PREFETCH_SPREAD,), str(value), f"{PREFETCH_SPREAD}: {_quote(str(value))} is not "
                                                           '"all" or "none"; nothing is spread')
