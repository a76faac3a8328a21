"""nezha/prefetch/listings.py: what a name's listings are asked as, and how their answers read."""

from __future__ import annotations

import json

import pytest

from nezha.prefetch import listings
from nezha.prefetch.names import HubRepo


def test_the_hub_is_asked_for_the_commit_of_a_revision_then_the_tree_at_that_commit():
    model, dataset = HubRepo("org/repo", "main"), HubRepo("org/set", "refs/pr/1", dataset=True)
    assert listings.hub_revision_path(model) == "/api/models/org/repo/revision/main"
    assert listings.hub_revision_path(dataset) == "/api/datasets/org/set/revision/refs%2Fpr%2F1"
    assert listings.hub_tree_path(model, "abc123") == "/api/models/org/repo/tree/abc123?recursive=true"
    assert listings.hub_commit(json.dumps({"id": "org/repo", "sha": "abc123", "siblings": []})) == "abc123"


@pytest.mark.parametrize("body", ["[]", "{}", '{"sha": ""}', "not json", '{"sha": 5}'])
def test_a_revision_answer_without_a_commit_is_a_bad_listing(body):
    with pytest.raises(listings.BadListing):
        listings.hub_commit(body)


def test_a_tree_page_gives_its_files_and_leaves_folders_out():
    page = [{"type": "directory", "path": "sub", "oid": "1", "size": 0},
            {"type": "file", "path": "config.json", "oid": "2", "size": 10},
            {"type": "file", "path": "sub/model-00001.safetensors", "oid": "3", "size": 9,
             "lfs": {"oid": "ab", "size": 9}}]
    assert listings.hub_files(json.dumps(page)) == ["config.json", "sub/model-00001.safetensors"]
    with pytest.raises(listings.BadListing):
        listings.hub_files('{"error": "nope"}')


@pytest.mark.parametrize(("link", "target"), [
    (None, None),
    ("", None),
    ('<https://huggingface.co/api/models/o/r/tree/c?recursive=true&cursor=ZXk>; rel="next"',
     "https://huggingface.co/api/models/o/r/tree/c?recursive=true&cursor=ZXk"),
    ('<https://x/prev>; rel="prev", <https://x/next>; rel="next"', "https://x/next"),
    ('<https://x/prev>; rel="prev"', None),
])
def test_the_next_page_is_the_link_named_next(link, target):
    assert listings.next_link(link) == target


@pytest.mark.parametrize(("name", "path", "url"), [
    (HubRepo("org/repo"), "config.json", "https://huggingface.co/org/repo/resolve/c0ffee/config.json"),
    (HubRepo("org/repo"), "sub dir/w#1.bin", "https://huggingface.co/org/repo/resolve/c0ffee/sub%20dir/w%231.bin"),
    (HubRepo("org/set", dataset=True), "data/train-0.parquet",
     "https://huggingface.co/datasets/org/set/resolve/c0ffee/data/train-0.parquet"),
])
def test_a_file_is_fetched_by_its_resolve_url_at_the_commit_spelt_as_huggingface_hub_spells_it(name, path, url):
    assert listings.hub_resolve_url("huggingface.co", name, "c0ffee", path) == url


S3_PAGE = """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>datasets</Name><Prefix>train/</Prefix>
<KeyCount>3</KeyCount><MaxKeys>3</MaxKeys><IsTruncated>{truncated}</IsTruncated>{token}
<Contents><Key>train/</Key><Size>0</Size></Contents>
<Contents><Key>train/a b.bin</Key><Size>5</Size></Contents>
<Contents><Key>train/c~d+e.bin</Key><Size>5</Size></Contents>
</ListBucketResult>"""


def test_an_s3_page_gives_its_keys_without_folder_markers_and_the_token_of_the_next_page():
    body = S3_PAGE.format(truncated="true", token="<NextContinuationToken>tok/1=</NextContinuationToken>")
    assert listings.s3_listing(body) == (["train/a b.bin", "train/c~d+e.bin"], "tok/1=")
    assert listings.s3_listing(S3_PAGE.format(truncated="false", token="")) == (
        ["train/a b.bin", "train/c~d+e.bin"], None)


@pytest.mark.parametrize("body", [
    S3_PAGE.format(truncated="true", token=""),
    "<Error><Code>AccessDenied</Code></Error>",
    "not xml <",
])
def test_an_s3_answer_that_is_no_complete_listing_page_is_a_bad_listing(body):
    with pytest.raises(listings.BadListing):
        listings.s3_listing(body)


def test_an_s3_listing_query_is_sorted_and_encoded_as_sigv4_wants_it():
    assert listings.s3_list_query("train/a b") == "list-type=2&prefix=train%2Fa%20b"
    assert listings.s3_list_query("p", "tok/1=") == "continuation-token=tok%2F1%3D&list-type=2&prefix=p"
    assert listings.s3_list_query("p", max_keys=2) == "list-type=2&max-keys=2&prefix=p"


def test_an_s3_key_is_addressed_path_style_and_encoded_as_botocore_encodes_it():
    assert listings.s3_object_url("s3.amazonaws.com", "datasets", "train/a b+c~d.bin") == \
        "https://s3.amazonaws.com/datasets/train/a%20b%2Bc~d.bin"


def test_a_manifest_gives_one_url_a_line_skipping_blanks_and_comments_and_reading_relative_ones():
    body = "# cifar\nhttps://a.example/x.bin\n\n  part-1.bin  \nhttps://a.example/x.bin\n/root.bin\n"
    assert listings.manifest_urls(body, "https://m.example/sets/files.txt") == [
        "https://a.example/x.bin", "https://m.example/sets/part-1.bin", "https://m.example/root.bin"]


def test_an_index_page_gives_the_files_under_its_folder_only():
    page = """<html><body><h1>Index of /cifar/</h1>
    <a href="?C=N;O=D">Name</a> <a href="../">Parent</a> <a href="sub/">sub/</a>
    <a href="data_batch_1.bin">data_batch_1.bin</a> <a href="/cifar/data_batch_2.bin">2</a>
    <a href="https://elsewhere.example/x.bin">x</a> <a href="/other/y.bin">y</a>
    <a href="data_batch_1.bin">again</a> <a href="meta#top">anchor</a></body></html>"""
    assert listings.index_urls(page, "https://d.example/cifar/") == [
        "https://d.example/cifar/data_batch_1.bin", "https://d.example/cifar/data_batch_2.bin"]


def test_the_hosts_outside_the_table_are_named_once_each_sorted():
    allowed = {"a.example", "b.example"}.__contains__
    urls = ["https://a.example/1", "https://evil.example/2", "http://b.example/3", "https://evil.example/4",
            "https://c.example/5", "ftp://a.example/6"]
    assert listings.hosts_outside(urls, allowed) == ["c.example", "evil.example", "ftp://a.example/6"]
    assert listings.hosts_outside(urls[:1], allowed) == []
