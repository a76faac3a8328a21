"""nezha/prefetch/names.py: what one entry of nezha.io/prefetch names."""

from __future__ import annotations

import pytest

from nezha.prefetch.names import BadName, HubRepo, Listing, ObjectUrl, S3Prefix, parse_name


@pytest.mark.parametrize(("text", "name"), [
    ("hf://meta-llama/Llama-3.1-8B", HubRepo("meta-llama/Llama-3.1-8B", "main")),
    ("hf://org/repo@v1.0", HubRepo("org/repo", "v1.0")),
    ("hf://org/repo@refs/pr/3", HubRepo("org/repo", "refs/pr/3")),
    ("hf://org/repo@9c3e1f0a9c3e1f0a9c3e1f0a9c3e1f0a9c3e1f0a", HubRepo("org/repo", "9c3e1f0a" * 5)),
    ("hf://datasets/HuggingFaceFW/fineweb", HubRepo("HuggingFaceFW/fineweb", "main", dataset=True)),
    ("hf://datasets/org/name@dev", HubRepo("org/name", "dev", dataset=True)),
    ("s3://datasets/imagenet/train/", S3Prefix("datasets", "imagenet/train/")),
    ("s3://my.bucket-1", S3Prefix("my.bucket-1", "")),
    ("s3://bkt/a b/c", S3Prefix("bkt", "a b/c")),
    ("https://data.example/cifar/", Listing("https://data.example/cifar/", manifest=False)),
    ("http://data.example/", Listing("http://data.example/", manifest=False)),
    ("https://data.example/sets/files.txt", Listing("https://data.example/sets/files.txt", manifest=True)),
    ("https://data.example/train-files.txt", Listing("https://data.example/train-files.txt", manifest=True)),
    ("https://data.example/readme.txt", ObjectUrl("https://data.example/readme.txt")),
    ("https://data.example/files.txt.gz", ObjectUrl("https://data.example/files.txt.gz")),
    ("http://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
     ObjectUrl("http://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz")),
    ("https://data.example/x/?list", Listing("https://data.example/x/?list", manifest=False)),
])
def test_each_kind_of_entry_parses_to_the_name_it_stands_for(text, name):
    assert parse_name(text) == name


def test_a_hub_name_knows_the_api_segment_of_its_kind():
    assert HubRepo("o/r").kind == "models" and HubRepo("o/r", dataset=True).kind == "datasets"


@pytest.mark.parametrize(("text", "why"), [
    ("hf://just-a-name", "hf://ORG/REPO[@REV]"),
    ("hf://a/b/c", "hf://ORG/REPO[@REV]"),
    ("hf://datasets/only", "hf://datasets/ORG/NAME[@REV]"),
    ("hf://org/repo@", "empty revision"),
    ("hf://org/repo@../main", "no branch, tag or commit"),
    ("hf://org/repo@a b", "no branch, tag or commit"),
    ("hf://org/re..po", "hf://ORG/REPO[@REV]"),
    ("hf://models/org/repo", "write hf://ORG/REPO"),
    ("hf://spaces/org/app", "spaces are not prefetched"),
    ("s3://Bad_Bucket/x", "no S3 bucket name"),
    ("s3://ab/x", "no S3 bucket name"),
    ("s3://a..b/x", "no S3 bucket name"),
    ("s3://bkt/a\nb", "control character"),
    ("gs://bucket/x", "not http://, https://, hf:// or s3://"),
    ("bucket/x", "not a URL"),
])
def test_a_malformed_name_is_refused_saying_why(text, why):
    with pytest.raises(BadName, match=why.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_name(text)
