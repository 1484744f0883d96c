"""One small interface over local paths, ``s3://bucket/key`` URIs and any backend registered for a scheme.

Everything in vlp that touches data goes through these functions, so every step works the same on a laptop
directory and on any S3-compatible object store (AWS S3, Ceph RGW, MinIO, SeaweedFS). A URI's scheme picks its
backend in one place (:func:`backend_for`); callers ask for what they need (:func:`local_path`, :func:`local_copy`,
:class:`AppendLog`, :func:`read_range`, :func:`list_files`, ...) and never test a scheme. A new backend is a
:class:`Backend` subclass given to :func:`register`: ``storage.register("mem", MemoryBackend())``.

Writes are atomic on every backend: a local write goes to a temporary file in the target directory and is renamed
into place; an S3 object (single PUT or multipart) becomes visible only when it is complete. A reader therefore
never sees half a file.

- :mod:`vlp.storage.base`: the :class:`Backend` interface, the settings and the scheme registry;
- :mod:`vlp.storage.files`: the functions every caller uses, whatever the backend;
- :mod:`vlp.storage.local`, :mod:`vlp.storage.s3`: the two backends vlp ships;
- :mod:`vlp.storage.parquet`: Parquet footers, row groups and columns through ranged reads.
"""

from __future__ import annotations

from vlp.storage.base import (
    Backend,
    StorageConfig,
    StorageError,
    backend_for,
    configure,
    current_config,
    register,
    unregister,
)
from vlp.storage.files import (
    AppendLog,
    ReadStats,
    absolute,
    canonical,
    copy,
    delete,
    download,
    exists,
    is_absolute,
    is_below,
    join,
    library_options,
    list_files,
    local_copy,
    local_path,
    normalize,
    parent,
    read_bytes,
    read_range,
    read_stats,
    read_tail,
    read_text,
    refuse_links,
    relative,
    remove_folder,
    reset_read_stats,
    size,
    upload,
    write_bytes,
    write_text,
)
from vlp.storage.local import LinkError, LocalBackend, local_path_under
from vlp.storage.parquet import (
    FOOTER_GUESS,
    ParquetFooter,
    RangedFile,
    parquet_footer,
    read_parquet,
    read_parquet_metadata,
    read_row_groups,
    write_parquet,
)
from vlp.storage.s3 import S3Backend, client, is_s3, object_store_options, split_s3

register("", LocalBackend())
register("s3", S3Backend())

__all__ = [
    "FOOTER_GUESS", "AppendLog", "Backend", "LinkError", "LocalBackend", "ParquetFooter", "RangedFile", "ReadStats",
    "S3Backend", "StorageConfig", "StorageError", "absolute", "backend_for", "canonical", "client", "configure",
    "copy", "current_config", "delete", "download", "exists", "is_absolute", "is_below", "is_s3", "join",
    "library_options", "list_files", "local_copy", "local_path", "local_path_under", "normalize",
    "object_store_options", "parent", "parquet_footer", "read_bytes", "read_parquet", "read_parquet_metadata",
    "read_range", "read_row_groups", "read_stats", "read_tail", "read_text", "refuse_links", "register", "relative",
    "remove_folder", "reset_read_stats", "size", "split_s3", "unregister", "upload", "write_bytes", "write_parquet",
    "write_text",
]  # fmt: skip
