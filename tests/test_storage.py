"""vlp.storage on local paths and against a real S3 server process (moto) on loopback."""

from __future__ import annotations

import ast
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
    if storage.local_path(uri) is None:
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


# --------------------------------------------------------------------------- ranged reads


def _row_group_file(uri: str, groups: int = 8, rows: int = 4, payload: int = 5000) -> list[bytes]:
    """A Parquet file with one row group per ``rows`` rows of ``payload``-byte random blobs; returns the blobs."""
    import pyarrow.parquet as pq

    blobs = [os.urandom(payload) for _ in range(groups * rows)]
    table = pa.table({"n": list(range(len(blobs))), "blob": pa.array(blobs, pa.binary())})
    table = table.replace_schema_metadata({b"vlp": b'{"k": 1}'})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rows, compression="none")
    storage.write_bytes(uri, sink.getvalue().to_pybytes())
    return blobs


def test_read_range_and_tail(root):
    uri = storage.join(root, "r.bin")
    data = bytes(range(256)) * 40
    storage.write_bytes(uri, data)
    storage.reset_read_stats()
    assert storage.read_range(uri, 100, 50) == data[100:150]
    assert storage.read_range(uri, len(data) - 5, 50) == data[-5:]  # short at the end of the file
    assert storage.read_range(uri, 7, 0) == b""
    assert storage.read_tail(uri, 10) == (data[-10:], len(data))
    assert storage.read_tail(uri, 10**6) == (data, len(data))
    stats = storage.read_stats()
    assert (stats.requests, stats.bytes) == (4, 50 + 5 + 10 + len(data))
    with pytest.raises(FileNotFoundError):
        storage.read_range(storage.join(root, "missing.bin"), 0, 1)
    with pytest.raises(ValueError):
        storage.read_range(uri, -1, 1)


def test_parquet_footer_and_row_groups_read_only_what_they_need(root):
    uri = storage.join(root, "t.parquet")
    blobs = _row_group_file(uri)
    total = storage.size(uri)
    storage.reset_read_stats()
    assert storage.read_parquet_metadata(uri) == {b"vlp": b'{"k": 1}'}
    footer = storage.parquet_footer(uri)
    meta_cost = storage.read_stats()
    assert footer.size == total and footer.metadata.num_row_groups == 8
    assert meta_cost.requests == 2 and meta_cost.bytes == 2 * 64 * 1024  # the last 64 KiB, twice
    storage.reset_read_stats()
    exact = storage.parquet_footer(uri, tail=footer.metadata.serialized_size + 8)  # the size an index records
    assert storage.read_stats() == storage.ReadStats(bytes=footer.metadata.serialized_size + 8, requests=1)
    assert exact.metadata.num_row_groups == 8 and exact.size == total
    storage.reset_read_stats()
    got = storage.read_row_groups(uri, [5], ["blob"], footer=footer)
    assert got["blob"].to_pylist() == blobs[20:24]
    cost = storage.read_stats()
    assert cost.requests == 1  # the row group's column chunk in one ranged read
    assert 4 * 5000 <= cost.bytes <= 4 * 5000 * 1.05  # about the rows' own bytes
    assert storage.read_row_groups(uri, [0, 7])["n"].to_pylist() == [0, 1, 2, 3, 28, 29, 30, 31]


def test_parquet_footer_larger_than_the_first_read(root):
    """A footer over 64 KiB (many row groups) takes a second ranged read, and parses."""
    import pyarrow.parquet as pq

    uri = storage.join(root, "many.parquet")
    table = pa.table({f"c{i}": list(range(3000)) for i in range(4)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=10)
    storage.write_bytes(uri, sink.getvalue().to_pybytes())
    footer = storage.parquet_footer(uri)
    assert footer.metadata.num_row_groups == 300 and footer.metadata.serialized_size > 64 * 1024
    assert storage.read_row_groups(uri, [299], footer=footer)["c3"].to_pylist() == list(range(2990, 3000))


def test_parquet_footer_of_what_is_not_parquet(root):
    uri = storage.join(root, "not.parquet")
    storage.write_bytes(uri, b"just some bytes, no footer here")
    with pytest.raises(storage.StorageError, match="not a Parquet file"):
        storage.parquet_footer(uri)


def test_ranged_read_cut_off_mid_transfer_is_fetched_again(s3_bucket, s3_config):
    """A body cut off after its headers (the connection closed half-way) is fetched again; when it keeps being
    cut off the error names the object and the range."""
    from common import FaultyProxy, fail_first

    uri = s3_bucket + "/cut.bin"
    data = os.urandom(200_000)
    storage.write_bytes(uri, data)
    try:
        with FaultyProxy(s3_config.endpoint_url, fail_first(2, "truncate", "cut.bin")) as url:
            storage.configure(storage.StorageConfig(**{**s3_config.__dict__, "endpoint_url": url}))
            assert storage.read_range(uri, 1000, 150_000) == data[1000:151_000]
        with FaultyProxy(s3_config.endpoint_url, fail_first(10**6, "truncate", "cut.bin")) as url:
            storage.configure(storage.StorageConfig(**{**s3_config.__dict__, "endpoint_url": url}))
            with pytest.raises(storage.StorageError, match=r"cut\.bin \(bytes=1000-150999\)"):
                storage.read_range(uri, 1000, 150_000)
    finally:
        storage.configure(s3_config)


def test_read_parquet_columns_on_s3_fetches_only_those_columns(s3_bucket):
    """check_inputs reads the ids and splits of a captions table: on S3 the text column is never fetched."""
    uri = s3_bucket + "/captions.parquet"
    texts = [os.urandom(2000).hex() for _ in range(1000)]
    table = pa.table({"video_id": [f"v{i}" for i in range(1000)], "split": ["train"] * 1000, "caption": texts})
    storage.write_parquet(uri, table.replace_schema_metadata({b"k": b"v"}))
    storage.reset_read_stats()
    got = storage.read_parquet(uri, columns=["video_id", "split"])
    assert got.column_names == ["video_id", "split"] and got["video_id"].to_pylist() == table["video_id"].to_pylist()
    assert got.schema.metadata == {b"k": b"v"}
    assert storage.read_stats().bytes < storage.size(uri) / 20  # the footer's 64 KiB and two small columns
    with pytest.raises(pa.ArrowInvalid, match="no column"):
        storage.read_parquet(uri, columns=["video_id", "nope"])


# --------------------------------------------------------------------------- no scheme test above storage

SRC = Path(__file__).resolve().parents[1] / "src" / "vlp"
_SCHEME_HELPERS = {"is_s3", "split_s3"}
_TESTS = {"startswith", "endswith", "removeprefix", "partition", "split"}


def _names_a_backend(value: object) -> bool:
    """A string that is, or starts, a URI of a registered backend other than local paths (``"s3://"``, ``"s3"``)."""
    if not isinstance(value, str) or not value:
        return False
    return storage.backend_for(value if "://" in value else value + "://") is not storage.backend_for("")


def scheme_tests(source: str) -> list[int]:
    """The lines of ``source`` that test a storage scheme: a call of ``is_s3``/``split_s3``, or a string naming a
    backend's scheme compared with (``==``, ``in``) or passed to a string test (``.startswith(...)``, ...)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            tested = name in _TESTS and any(_names_a_backend(c) for a in node.args for c in _constants(a))
            if name in _SCHEME_HELPERS or tested:
                found.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(_names_a_backend(c) for c in _constants(node)):
            found.append(node.lineno)
    return sorted(set(found))


def _constants(node: ast.AST) -> list[object]:
    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]


def test_no_module_above_storage_tests_a_scheme():
    """Storage is chosen by scheme in one place (vlp.storage.base): every other module asks vlp.storage for what it
    needs (a local path, a local copy, an append, ...), so a new backend edits no file outside vlp/storage/."""
    above = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] != "storage"]
    found = {str(p.relative_to(SRC)): lines for p in above if (lines := scheme_tests(p.read_text(encoding="utf-8")))}
    assert found == {}


def test_a_scheme_test_is_found():
    source = """
def a(uri):
    if storage.is_s3(uri):
        return uri.startswith("s3://")
    ok = uri.startswith(("/", "s3://")) or scheme == "s3" or uri[:5] in {"s3://"}
    return is_s3(uri) or split_s3(uri)
def b(uri):
    \"\"\"A local path or an ``s3://`` URI.\"\"\"
    return uri.startswith("sqlite:///") or f"s3://{uri}" or parts.scheme == "http"
"""
    assert scheme_tests(source) == [3, 4, 5, 6]


def test_what_callers_ask_of_each_backend(root, tmp_path):
    """The capabilities that replaced the scheme tests above storage answer as the old branches did."""
    uri = storage.join(root, "d", "x.txt")
    local = storage.local_path(uri)
    assert (local == uri) if root.startswith("/") else local is None
    assert storage.is_absolute(uri) and not storage.is_absolute("d/x.txt")
    assert storage.parent(uri) == storage.join(root, "d")
    assert storage.normalize(storage.join(root, "./d/x.txt")) == (uri if local else storage.join(root, "./d/x.txt"))
    assert storage.is_below(root, uri) and not storage.is_below(root, root)
    assert not storage.is_below(root, storage.join(root, "d/../../out.txt")) and not storage.is_below(root, "/etc")
    log = storage.AppendLog(uri)
    log.append('{"step": 1}')
    log.append('{"step": 2}')
    assert storage.read_text(uri) == '{"step": 1}\n{"step": 2}\n'
    storage.AppendLog(uri).append('{"step": 3}')  # a new log goes on where the file ends, on every backend
    assert storage.read_text(uri).splitlines() == ['{"step": 1}', '{"step": 2}', '{"step": 3}']
    log.replace(['{"step": 1}'])
    assert storage.read_text(uri) == '{"step": 1}\n'
    assert [storage.relative(f, root) for f in storage.list_files(root)] == ["d/x.txt"]
    storage.delete(uri)
    storage.remove_folder(storage.join(root, "d"))
    assert not storage.exists(storage.join(root, "d")) and not os.path.exists(storage.join(root, "d"))
