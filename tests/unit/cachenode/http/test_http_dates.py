"""http_date reads every date as it did when it made a datetime of it: the same timestamp, or None for the same."""

import itertools
import re
from datetime import datetime, timezone

import pytest

from cachenode.http.fields import http_date

# The reading http_date made before it counted the seconds itself: the reference.
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_TIME = r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)"
_FORMS = [re.compile(p, re.IGNORECASE | re.ASCII) for p in (
    rf"[a-z]{{3}}, (?P<d>\d\d) (?P<b>[a-z]{{3}}) (?P<Y>\d{{4}}) {_TIME} GMT",
    rf"[a-z]{{6,9}}, (?P<d>\d\d)-(?P<b>[a-z]{{3}})-(?P<y>\d\d) {_TIME} GMT",
    rf"[a-z]{{3}} (?P<b>[a-z]{{3}}) (?P<d>\d\d| \d) {_TIME} (?P<Y>\d{{4}})",
)]


def by_datetime(value):
    if not value:
        return None
    text = value.strip(" \t")
    for pattern in _FORMS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        month = _MONTHS.get(m["b"].lower())
        if month is None:
            return None
        if "Y" in pattern.groupindex:
            year = int(m["Y"])
        else:
            year = int(m["y"]) + (1900 if int(m["y"]) >= 70 else 2000)
        try:
            stamp = datetime(year, month, int(m["d"]), int(m["H"]), int(m["M"]), min(int(m["S"]), 59),
                             tzinfo=timezone.utc)
        except ValueError:
            return None
        return stamp.timestamp()
    return None


YEARS = ["0000", "0001", "1969", "1970", "1999", "2000", "2024", "2100", "9999"]
MONTHS = ["Jan", "feb", "FEB", "Apr", "Dec", "Xyz"]
DAYS = ["00", "01", "28", "29", "30", "31", "32", "99"]
TIMES = ["00:00:00", "23:59:59", "23:59:60", "12:30:99", "24:00:00", "10:60:00", "99:99:99"]


def spelt(form, year, month, day, time):
    if form == "imf":
        return f"Sun, {day} {month} {year} {time} GMT"
    if form == "rfc850":
        return f"Sunday, {day}-{month}-{year[2:]} {time} GMT"
    return f"Sun {month} {day if day[0] != '0' else ' ' + day[1]} {time} {year}"


ODD = [None, "", " ", "Sun, 29 Nov 2026 02:58:40 GMT", "  Sun, 29 Nov 2026 02:58:40 GMT\t",
       "sun, 29 nov 2026 02:58:40 gmt", "Sun, 29 Nov 2026 02:58:40 UTC", "Sun,  29 Nov 2026 02:58:40 GMT",
       "Sun, 29 Nov 2026 02:58:40 GMT, Mon, 30 Nov 2026 02:58:40 GMT", "0", "-1", "Sun, ２9 Nov 2026 02:58:40 GMT",
       "Sun Nov  1 02:58:40 2026", "Sun Nov 01 02:58:40 2026", "Sunday, 29-Nov-69 02:58:40 GMT",
       "Sunday, 29-Nov-70 02:58:40 GMT", "Thu, 01 Jan 1970 00:00:00 GMT", "Wed, 31 Dec 1969 23:59:59 GMT"]


@pytest.mark.parametrize("form", ["imf", "rfc850", "asctime"])
def test_every_date_reads_as_a_datetime_read_it(form):
    dates = [spelt(form, *parts) for parts in itertools.product(YEARS, MONTHS, DAYS, TIMES)]
    assert sum(by_datetime(text) is not None for text in dates) > 500  # valid ones too, not only refusals
    for text in dates:
        assert http_date.__wrapped__(text) == by_datetime(text), text


def test_odd_values_read_as_a_datetime_read_them_remembered_or_not():
    for text in ODD:
        assert http_date.__wrapped__(text) == by_datetime(text), text
        assert http_date(text) == by_datetime(text), text
    assert http_date("Sun, 29 Nov 2026 02:58:40 GMT") == 1_795_921_120.0
