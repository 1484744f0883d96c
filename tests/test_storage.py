"""vlp.storage on local paths and against a real S3 server process (moto) on loopback."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import ACCESS_KEY, SECRET_KEY
from vlp import storage


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """The same tests run on a local directory and on a fresh S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_bucket") + "/prefix"


def test_join_and_split():
    assert storage.join("s3://b/a/", "/x/", "y") == "s3://b/a/x/y"
    assert storage.join("/tmp/a", "b") == "/tmp/a/b"
    assert storage.join("rel", "", "b") == "rel/b"
    assert storage.split_s3("s3://bucket/a/b") == ("bucket", "a/b")
    assert storage.split_s3("s3://bucket") == ("bucket", "")
    with pytest.raises(storage.StorageError):
        storage.split_s3("s3:///key")
    with pytest.raises(storage.StorageError):
        storage.split_s3("/local/path")


def test_bytes_roundtrip_exists_list_delete(root):
    a, b = storage.join(root, "d/a.bin"), storage.join(root, "d/e/b.txt")
    assert not storage.exists(a)
    assert not storage.exists(storage.join(root, "d"))
    storage.write_bytes(a, b"\x00\x01payload")
    storage.write_text(b, "héllo")
    assert storage.exists(a)
    assert storage.exists(storage.join(root, "d"))  # a non-empty "directory"
    assert storage.read_bytes(a) == b"\x00\x01payload"
    assert storage.read_text(b) == "héllo"
    assert storage.size(a) == 9
    assert storage.list_files(storage.join(root, "d")) == [a, b]
    assert storage.list_files(storage.join(root, "d"), suffix=".txt") == [b]
    assert storage.list_files(storage.join(root, "d"), recursive=False) == [a]
    assert storage.list_files(storage.join(root, "missing")) == []
    storage.delete(a)
    storage.delete(a)  # deleting what is gone is not an error
    assert not storage.exists(a)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(a)


def test_upload_download_and_local_copy(root, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(1000))
    uri = storage.join(root, "up/src.bin")
    storage.upload(src, uri)
    dst = tmp_path / "nested" / "dst.bin"
    assert storage.download(uri, dst) == str(dst)
    assert dst.read_bytes() == src.read_bytes()
    with storage.local_copy(uri) as path:
        assert Path(path).read_bytes() == src.read_bytes()
        local = path
    if storage.is_s3(uri):
        assert not os.path.exists(local), "the temporary copy of an S3 object is removed after the block"
    with pytest.raises(FileNotFoundError):
        storage.download(storage.join(root, "nope.bin"), tmp_path / "x")


@pytest.mark.parametrize("other", ["local", "s3"])
def test_copy_between_and_within_local_and_s3(root, other, tmp_path, request):
    data = os.urandom(3000)
    src = storage.join(root, "a/src.bin")
    storage.write_bytes(src, data)
    base = str(tmp_path / "other") if other == "local" else request.getfixturevalue("s3_bucket") + "/copies"
    dst = storage.join(base, "x/y/dst.bin")
    storage.copy(src, dst)
    assert storage.read_bytes(dst) == data and storage.read_bytes(src) == data
    back = storage.join(root, "b/back.bin")
    storage.copy(dst, back)
    assert storage.read_bytes(back) == data
    with pytest.raises(FileNotFoundError):
        storage.copy(storage.join(root, "missing.bin"), storage.join(base, "never.bin"))
    assert not storage.exists(storage.join(base, "never.bin"))


def test_parquet_roundtrip_with_metadata(root):
    table = pa.table({"id": ["a", "b"], "n": [1, 2]}).replace_schema_metadata({"vlp": '{"k": 1}'})
    uri = storage.join(root, "t.parquet")
    storage.write_parquet(uri, table)
    back = storage.read_parquet(uri)
    assert back.to_pylist() == [{"id": "a", "n": 1}, {"id": "b", "n": 2}]
    assert storage.read_parquet(uri, columns=["n"]).column_names == ["n"]
    assert storage.read_parquet_metadata(uri)[b"vlp"] == b'{"k": 1}'


def test_parquet_bytes_are_deterministic(tmp_path):
    table = pa.table({"id": ["a", "b"], "x": [0.5, 1.5]})
    storage.write_parquet(tmp_path / "1.parquet", table)
    storage.write_parquet(tmp_path / "2.parquet", table)
    assert (tmp_path / "1.parquet").read_bytes() == (tmp_path / "2.parquet").read_bytes()


def test_large_upload_goes_multipart_and_is_whole(s3_bucket, s3_config, tmp_path):
    storage.configure(
        storage.StorageConfig(**{**s3_config.__dict__, "multipart_threshold_mb": 5, "multipart_chunk_mb": 5})
    )
    data = os.urandom(12 * 1024 * 1024 + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    uri = f"{s3_bucket}/big.bin"
    storage.upload(src, uri)
    bucket, key = storage.split_s3(uri)
    etag = storage.client().head_object(Bucket=bucket, Key=key)["ETag"]
    assert "-" in etag, f"expected a multipart ETag (md5-N), got {etag}"
    assert storage.read_bytes(uri) == data
    storage.write_bytes(f"{s3_bucket}/big2.bin", data)  # write_bytes of large data also goes multipart
    assert storage.size(f"{s3_bucket}/big2.bin") == len(data)


def test_local_write_is_atomic_under_concurrent_reads(tmp_path):
    """A reader polling the file while it is rewritten only ever sees a whole old or whole new version."""
    path = tmp_path / "f.bin"
    versions = [bytes([i]) * 2_000_000 for i in range(8)]
    storage.write_bytes(path, versions[0])
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            seen.add(data[:1] + data[-1:] + len(data).to_bytes(4, "big"))

    thread = threading.Thread(target=reader)
    thread.start()
    for v in versions[1:]:
        storage.write_bytes(path, v)
    stop.set()
    thread.join()
    whole = {v[:1] + v[-1:] + len(v).to_bytes(4, "big") for v in versions}
    assert seen <= whole, "a reader saw a partially written file"
    assert not [p for p in tmp_path.iterdir() if p.name != "f.bin"], "temporary files were left behind"


def test_failed_local_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "f.bin"
    storage.write_bytes(path, b"old")
    with pytest.raises(FileNotFoundError):
        storage.download(tmp_path / "missing.bin", path)  # fails half-way, inside the atomic write
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_env_endpoint_is_used_when_config_is_empty(s3_bucket, s3_endpoint, monkeypatch):
    storage.write_bytes(f"{s3_bucket}/env.txt", b"via config")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    storage.configure(storage.StorageConfig())
    assert storage.read_bytes(f"{s3_bucket}/env.txt") == b"via config"


def test_a_missing_bucket_is_a_storage_error_not_a_botocore_traceback(s3_config):
    for call in (storage.exists, storage.list_files, storage.delete):
        with pytest.raises(storage.StorageError, match="no-such-bucket-vlp"):
            call("s3://no-such-bucket-vlp/some/prefix")
