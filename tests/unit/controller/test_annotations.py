"""StatefulSet annotations -> Spec: valid values, defaults, and invalid values
that keep the last value in force with a Problem naming the full key."""

from __future__ import annotations

import math

import pytest

from controller.annotations import (
    AUTOSCALE,
    MAX_REPLICAS,
    MIN_REPLICAS,
    REPLICAS_PER_KEY,
    SCALE_COOLDOWN,
    SCALE_DOWN_DELAY,
    SCALE_WINDOW,
    TARGET,
    AnnotationError,
    Problem,
    Spec,
    parse_prefetch,
    parse_quantity,
    read_spec,
)
from nezha.errors import NezhaError

# A previous read in which every field differs from its default, so a kept
# value is told apart from a default one.
LAST = Spec(autoscale=True, min_replicas=2, max_replicas=8, target_bytes_per_second=5e8,
            scale_down_delay=120.0, scale_window=10.0, scale_cooldown=30.0, replicas_per_key=2)
# Enough for autoscaling to be valid, so other fields can be tested alone.
SCALING = {AUTOSCALE: "true", MAX_REPLICAS: "8", TARGET: "500M"}


@pytest.mark.parametrize(("annotations", "field", "value"), [
    (SCALING, "autoscale", True),
    ({AUTOSCALE: " TRUE ", MAX_REPLICAS: "8", TARGET: "1G"}, "autoscale", True),
    ({AUTOSCALE: "False"}, "autoscale", False),
    ({MIN_REPLICAS: "3"}, "min_replicas", 3),
    ({MIN_REPLICAS: " 3\n"}, "min_replicas", 3),
    ({MIN_REPLICAS: "007"}, "min_replicas", 7),
    ({MAX_REPLICAS: "12"}, "max_replicas", 12),
    ({MAX_REPLICAS: "2147483647"}, "max_replicas", 2**31 - 1),
    ({MIN_REPLICAS: "4", MAX_REPLICAS: "4"}, "min_replicas", 4),
    ({TARGET: "250M"}, "target_bytes_per_second", 250e6),
    ({TARGET: "1.5G"}, "target_bytes_per_second", 1.5e9),
    ({TARGET: "0.5"}, "target_bytes_per_second", 0.5),
    ({SCALE_DOWN_DELAY: "600"}, "scale_down_delay", 600.0),
    ({SCALE_DOWN_DELAY: "0"}, "scale_down_delay", 0.0),
    ({SCALE_DOWN_DELAY: "1.2k"}, "scale_down_delay", 1200.0),
    ({SCALE_WINDOW: "7.5"}, "scale_window", 7.5),
    ({SCALE_COOLDOWN: "0"}, "scale_cooldown", 0.0),
    ({SCALE_COOLDOWN: "90"}, "scale_cooldown", 90.0),
    ({REPLICAS_PER_KEY: "3"}, "replicas_per_key", 3),
])
def test_a_valid_annotation_sets_its_field(annotations, field, value):
    spec, problems = read_spec(annotations, last=LAST)
    assert getattr(spec, field) == value
    assert problems == []


@pytest.mark.parametrize("annotations", [None, {}, {"app": "nezha", "kubectl.kubernetes.io/restartedAt": "x"}])
def test_no_nezha_annotations_give_the_defaults(annotations):
    assert read_spec(annotations, last=LAST) == (Spec(), [])


def test_the_defaults_are_the_documented_ones():
    assert Spec() == Spec(autoscale=False, min_replicas=None, max_replicas=None, target_bytes_per_second=None,
                          scale_down_delay=300.0, scale_window=30.0, scale_cooldown=60.0, replicas_per_key=None)


def test_every_field_at_once():
    spec, problems = read_spec({AUTOSCALE: "true", MIN_REPLICAS: "2", MAX_REPLICAS: "10", TARGET: "400M",
                                SCALE_DOWN_DELAY: "600", SCALE_WINDOW: "15", SCALE_COOLDOWN: "45",
                                REPLICAS_PER_KEY: "2"})
    assert problems == []
    assert spec == Spec(autoscale=True, min_replicas=2, max_replicas=10, target_bytes_per_second=4e8,
                        scale_down_delay=600.0, scale_window=15.0, scale_cooldown=45.0, replicas_per_key=2)


@pytest.mark.parametrize(("key", "field"), [
    (MIN_REPLICAS, "min_replicas"),
    (MAX_REPLICAS, "max_replicas"),
    (TARGET, "target_bytes_per_second"),
    (SCALE_DOWN_DELAY, "scale_down_delay"),
    (SCALE_WINDOW, "scale_window"),
    (SCALE_COOLDOWN, "scale_cooldown"),
    (REPLICAS_PER_KEY, "replicas_per_key"),
])
def test_a_removed_annotation_returns_to_the_default_not_the_last_value(key, field):
    spec, problems = read_spec({}, last=LAST)
    assert getattr(spec, field) == getattr(Spec(), field)
    assert problems == []


# Each invalid value keeps LAST's value for its field and names the full key
# and the value seen. SCALING keeps autoscale valid, so only this field fails.
@pytest.mark.parametrize(("key", "value", "field", "why"), [
    (AUTOSCALE, "yes", "autoscale", '"yes" is not "true" or "false"'),
    (AUTOSCALE, "1", "autoscale", '"1" is not "true" or "false"'),
    (AUTOSCALE, "on", "autoscale", '"on" is not "true" or "false"'),
    (AUTOSCALE, "", "autoscale", '"" is not "true" or "false"'),
    (MIN_REPLICAS, "two", "min_replicas", '"two" is not a whole number'),
    (MIN_REPLICAS, "0", "min_replicas", '"0" is less than 1'),
    (MIN_REPLICAS, "-1", "min_replicas", '"-1" is not a whole number'),
    (MIN_REPLICAS, "+3", "min_replicas", '"+3" is not a whole number'),
    (MIN_REPLICAS, "3.0", "min_replicas", '"3.0" is not a whole number'),
    (MIN_REPLICAS, "3k", "min_replicas", '"3k" is not a whole number'),
    (MIN_REPLICAS, "", "min_replicas", '"" is not a whole number'),
    (MIN_REPLICAS, "\u0663", "min_replicas", '"\u0663" is not a whole number'),  # Arabic-Indic three
    (MAX_REPLICAS, "2147483648", "max_replicas", '"2147483648" is more than 2147483647'),
    (MAX_REPLICAS, "9" * 5000, "max_replicas", "is more than 2147483647"),
    (MAX_REPLICAS, "ten", "max_replicas", '"ten" is not a whole number'),
    (TARGET, "0", "target_bytes_per_second", '"0" is not greater than 0'),
    (TARGET, "-5M", "target_bytes_per_second", '"-5M" is negative'),
    (TARGET, "250m", "target_bytes_per_second", '"250m" ends in "m", which Kubernetes reads as milli'),
    (TARGET, "250Mi", "target_bytes_per_second", '"250Mi" is not a number with an optional k, M or G suffix'),
    (TARGET, "1e9", "target_bytes_per_second", '"1e9" is not a number with an optional k, M or G suffix'),
    (TARGET, "nan", "target_bytes_per_second", '"nan" is not a number'),
    (TARGET, "inf", "target_bytes_per_second", '"inf" is not a number'),
    (TARGET, "9" * 400 + "G", "target_bytes_per_second", "is too large"),
    (SCALE_DOWN_DELAY, "-1", "scale_down_delay", '"-1" is negative'),
    (SCALE_DOWN_DELAY, "5m", "scale_down_delay", '"5m" ends in "m", which Kubernetes reads as milli'),
    (SCALE_DOWN_DELAY, "30s", "scale_down_delay", '"30s" is not a number'),
    (SCALE_DOWN_DELAY, "Infinity", "scale_down_delay", '"Infinity" is not a number'),
    (SCALE_WINDOW, "0", "scale_window", '"0" is not greater than 0'),
    (SCALE_WINDOW, "NaN", "scale_window", '"NaN" is not a number'),
    (SCALE_COOLDOWN, "-0.5", "scale_cooldown", '"-0.5" is negative'),
    (SCALE_COOLDOWN, "soon", "scale_cooldown", '"soon" is not a number'),
    (REPLICAS_PER_KEY, "0", "replicas_per_key", '"0" is less than 1'),
    (REPLICAS_PER_KEY, "all", "replicas_per_key", '"all" is not a whole number'),
])
def test_an_invalid_value_keeps_the_last_one_and_names_the_full_key(key, value, field, why):
    spec, problems = read_spec({**SCALING, key: value}, last=LAST)
    assert getattr(spec, field) == getattr(LAST, field)
    [problem] = problems
    assert problem.keys == (key,)
    assert problem.value == value
    assert problem.message.startswith(f"{key}: ")
    assert why in problem.message
    assert "\n" not in problem.message


@pytest.mark.parametrize(("key", "value", "last", "kept"), [
    (MIN_REPLICAS, "two", Spec(min_replicas=2), "keeping 2"),
    (MIN_REPLICAS, "two", Spec(), "keeping it unset"),
    (SCALE_DOWN_DELAY, "-1", Spec(), "keeping the default 300"),
    (SCALE_DOWN_DELAY, "-1", Spec(scale_down_delay=120.0), "keeping 120"),
    (SCALE_WINDOW, "0", Spec(scale_window=2.5), "keeping 2.5"),
    (TARGET, "nan", Spec(target_bytes_per_second=2.5e8), "keeping 250000000"),
    (AUTOSCALE, "yes", Spec(), "keeping the default false"),
])
def test_the_message_says_what_was_kept(key, value, last, kept):
    _, [problem] = read_spec({key: value}, last=last)
    assert problem.message.endswith(f"; {kept}")


def test_the_message_quotes_the_value_as_the_example_shows():
    _, [problem] = read_spec({MIN_REPLICAS: "two"}, last=Spec(min_replicas=2))
    assert problem.message == 'nezha.io/min-replicas: "two" is not a whole number; keeping 2'


@pytest.mark.parametrize(("value", "shown"), [
    ("3\n4", '"3\\u000a4"'),
    ("3\u00a04", '"3\\u00a04"'),  # a no-break space inside; around it is stripped
    ('"3"', '"\\"3\\""'),
    ("x" * 300, '"' + "x" * 200 + '"… (300 chars)'),
])
def test_the_message_stays_one_short_line_whatever_the_value(value, shown):
    _, [problem] = read_spec({MIN_REPLICAS: value})
    assert shown in problem.message
    assert problem.message.isprintable()
    assert problem.value == value


@pytest.mark.parametrize(("annotations", "last", "kept"), [
    ({MIN_REPLICAS: "5", MAX_REPLICAS: "3"}, LAST, (2, 8)),
    ({MIN_REPLICAS: "5", MAX_REPLICAS: "3"}, Spec(), (None, None)),
    # min invalid keeps 2; the new max 1 would then cross it, so both revert.
    ({MIN_REPLICAS: "x", MAX_REPLICAS: "1"}, LAST, (2, 8)),
])
def test_min_above_max_keeps_both_last_values_and_names_both_keys(annotations, last, kept):
    spec, problems = read_spec(annotations, last=last)
    assert (spec.min_replicas, spec.max_replicas) == kept
    [problem] = [p for p in problems if len(p.keys) == 2]
    assert problem.keys == (MIN_REPLICAS, MAX_REPLICAS)
    assert MIN_REPLICAS in problem.message and MAX_REPLICAS in problem.message
    assert " > " in problem.value


def test_min_above_max_message_names_both_values():
    _, [problem] = read_spec({MIN_REPLICAS: "5", MAX_REPLICAS: "3"}, last=LAST)
    assert problem == Problem((MIN_REPLICAS, MAX_REPLICAS), "5 > 3",
                              "nezha.io/min-replicas (5) is greater than nezha.io/max-replicas (3); keeping 2 and 8")


def test_a_crossed_last_pair_is_never_returned():
    spec, _ = read_spec({MIN_REPLICAS: "5", MAX_REPLICAS: "3"}, last=Spec(min_replicas=9, max_replicas=4))
    assert (spec.min_replicas, spec.max_replicas) == (None, None)


@pytest.mark.parametrize(("annotations", "missing"), [
    ({AUTOSCALE: "true", MAX_REPLICAS: "8"}, (TARGET,)),
    ({AUTOSCALE: "true", MAX_REPLICAS: "8", TARGET: "0"}, (TARGET,)),  # invalid, nothing valid before
    ({AUTOSCALE: "true", TARGET: "500M"}, (MAX_REPLICAS,)),
    ({AUTOSCALE: "true"}, (TARGET, MAX_REPLICAS)),
])
def test_autoscale_without_a_target_or_a_max_stays_off(annotations, missing):
    spec, problems = read_spec(annotations)
    assert spec.autoscale is False
    [problem] = [p for p in problems if p.keys[0] == AUTOSCALE]
    assert problem.keys == (AUTOSCALE, *missing)
    assert all(key in problem.message for key in problem.keys)
    assert problem.message.endswith("autoscaling stays off")


def test_autoscale_without_a_target_says_which_keys_it_needs():
    _, problems = read_spec({AUTOSCALE: "true"})
    assert problems == [Problem((AUTOSCALE, TARGET, MAX_REPLICAS), "true",
                                'nezha.io/autoscale: "true" needs nezha.io/target-bytes-per-second and '
                                "nezha.io/max-replicas; autoscaling stays off")]


def test_autoscale_kept_from_last_still_needs_a_target():
    spec, [one, two] = read_spec({AUTOSCALE: "maybe", MAX_REPLICAS: "8"}, last=LAST)
    assert spec.autoscale is False
    assert (one.keys, two.keys) == ((AUTOSCALE,), (AUTOSCALE, TARGET))


def test_an_invalid_target_with_a_valid_last_target_keeps_autoscaling_on():
    spec, [problem] = read_spec({**SCALING, TARGET: "lots"}, last=LAST)
    assert (spec.autoscale, spec.target_bytes_per_second) == (True, 5e8)
    assert problem.keys == (TARGET,)


@pytest.mark.parametrize(("annotations", "min_replicas"), [
    (SCALING, 1),
    ({**SCALING, MIN_REPLICAS: "3"}, 3),
    ({MAX_REPLICAS: "8"}, None),  # autoscale off: no bound is invented
])
def test_a_missing_min_is_1_only_when_autoscaling(annotations, min_replicas):
    spec, problems = read_spec(annotations)
    assert spec.min_replicas == min_replicas
    assert problems == []


@pytest.mark.parametrize(("key", "suggestion"), [
    ("nezha.io/min-replica", "nezha.io/min-replicas"),
    ("nezha.io/autoscal", "nezha.io/autoscale"),
    ("nezha.io/scale-cooldwn", "nezha.io/scale-cooldown"),
    ("nezha.io/Min-Replicas", "nezha.io/min-replicas"),
    ("nezha.io/target-bytes-per-sec0nd", "nezha.io/target-bytes-per-second"),
    ("nezha.io/mix-replicas", "nezha.io/max-replicas or nezha.io/min-replicas"),
])
def test_a_near_miss_of_a_known_key_is_reported_and_changes_nothing(key, suggestion):
    spec, [problem] = read_spec({key: "3"}, last=LAST)
    assert spec == Spec()
    assert problem == Problem((key,), "3", f"unknown annotation {key}: did you mean {suggestion}? ignored")


@pytest.mark.parametrize("key", [
    "nezha.io/status", "nezha.io/prefetch", "nezha.io/prefetch-status", "nezha.io/injected", "nezha.io/inject",
    "nezha.io/something-else", "nezha.io/replicas",
    "example.com/min-replicas", "min-replicas", "nezha.io.min-replicas", "other.nezha.io/min-replicas",
])
def test_unrelated_and_controller_written_keys_are_ignored(key):
    assert read_spec({key: "x"}, last=LAST) == (Spec(), [])


def test_problems_come_sorted_by_keys():
    _, problems = read_spec({SCALE_WINDOW: "0", AUTOSCALE: "yes", "nezha.io/min-replica": "1", MAX_REPLICAS: "x"})
    assert [p.keys for p in problems] == sorted(p.keys for p in problems)
    assert len(problems) == 4


def test_annotation_error_carries_its_problem_and_is_both_kinds_of_error():
    problem = Problem((MIN_REPLICAS,), "two", 'nezha.io/min-replicas: "two" is not a whole number; keeping 2')
    error = AnnotationError(problem)
    assert error.problem is problem
    assert str(error) == problem.message
    assert isinstance(error, ValueError) and isinstance(error, NezhaError)


@pytest.mark.parametrize(("text", "value"), [
    ("250M", 250e6), ("1k", 1e3), ("1K", 1e3), ("2G", 2e9), ("1.5G", 1.5e9), (".5k", 500.0),
    ("0", 0.0), (" 42 ", 42.0), ("007", 7.0),
])
def test_quantities_use_decimal_suffixes(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [
    "250m", "1Mi", "1Ki", "1T", "1e3", "-1", "+1", "nan", "inf", "-inf", "Infinity", "", " ", ".", "1.", "1,5",
    "1 k", "0x10", "١", "1_000",
])
def test_anything_else_is_not_a_quantity_and_the_error_names_the_text(text):
    with pytest.raises(ValueError) as e:
        parse_quantity(text)
    assert f'"{text}"' in str(e.value) or not text.isprintable()


def test_quantities_are_always_finite():
    with pytest.raises(ValueError, match="too large"):
        parse_quantity("9" * 400)
    assert math.isfinite(parse_quantity("9" * 300))


@pytest.mark.parametrize(("value", "urls"), [
    (None, []),
    ("", []),
    (" , ,", []),
    ("http://a.example/x", ["http://a.example/x"]),
    (" https://a.example/x , http://b.example:8080/y?z=1 ", ["https://a.example/x", "http://b.example:8080/y?z=1"]),
    ("http://a.example/x,http://a.example/x,,http://b.example/", ["http://a.example/x", "http://b.example/"]),
    ("HTTPS://A.example/Data.tar", ["HTTPS://A.example/Data.tar"]),
    ("http://[::1]:8000/x", ["http://[::1]:8000/x"]),
])
def test_prefetch_splits_strips_and_deduplicates_in_order(value, urls):
    assert parse_prefetch(value) == (urls, [])


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://a.example/x", "is not an http:// or https:// URL"),
    ("file:///etc/passwd", "is not an http:// or https:// URL"),
    ("a.example/x", "is not an http:// or https:// URL"),
    ("/relative/path", "is not an http:// or https:// URL"),
    ("http:///x", "has no host"),
    ("https:a.example", "has no host"),
    ("http://:80/x", "has no host"),
    ("http://user@a.example/x", "has userinfo"),
    ("http://user:secret@a.example/x", "has userinfo"),
    ("http://a.example/x y", "contains whitespace or a control character"),
    ("http://a.example/\x00", "contains whitespace or a control character"),
    ("http://a.example/\u00a0x", "contains whitespace or a control character"),
    ("http://a.example:99999/x", "is not a valid URL"),
    ("http://a.example:port/x", "is not a valid URL"),
    ("http://[::1/x", "is not a valid URL"),
    ("http://a.example/" + "x" * 8200, "is longer than 8192 characters"),
])
def test_a_bad_prefetch_url_is_dropped_with_a_problem_naming_the_key_and_url(url, why):
    urls, [problem] = parse_prefetch(f"http://ok.example/1,{url}")
    assert urls == ["http://ok.example/1"]
    assert problem.keys == ("nezha.io/prefetch",)
    assert problem.value == url
    assert problem.message.startswith("nezha.io/prefetch: ")
    assert why in problem.message
    assert problem.message.isprintable()


def test_a_duplicated_bad_url_is_reported_once():
    _, problems = parse_prefetch("ftp://a/x, ftp://a/x")
    assert len(problems) == 1


def test_a_url_of_exactly_the_limit_is_kept():
    url = "http://a.example/" + "x" * (8192 - len("http://a.example/"))
    assert parse_prefetch(url) == ([url], [])


def test_prefetch_keeps_the_first_1000_urls_with_one_problem():
    value = ",".join(f"http://a.example/{i}" for i in range(1200))
    urls, [problem] = parse_prefetch(value)
    assert urls == [f"http://a.example/{i}" for i in range(1000)]
    assert problem.keys == ("nezha.io/prefetch",)
    assert problem.value == "1200 URLs"
    assert "more than 1000" in problem.message and '"http://a.example/1000"' in problem.message
