"""A clip index: a collection's clips encoded once by a trained model, searchable by text (``vlp index``,
``vlp search``; docs/guides/search.md).

What is stored, and why
-----------------------
One LanceDB table, ``clips``, in a local directory or under an ``s3://`` prefix (LanceDB is embedded: no server,
the files are the database). One row per clip:

- ``video_id``: the clip's id in the frames store (and the dataset).
- ``vector``: the clip's pooled feature, the family's ``Encoded.feat`` (float32, fixed size): what the first stage
  of a search ranks by dot product with the query's feature, over every row.
- ``tokens``: the clip's token features, ``Encoded.tokens`` flattened (float32), when they hold at most
  ``index.max_token_floats`` floats, else null: what the family's exact score reads (TS2-Net's frame score reads
  the frame features; ALPRO's and ALBEF's re-ranking fuses them with the query's tokens). Without them the exact
  stage encodes its candidate clips again from the frames, which gives the same features.
- ``thumbnail``: the clip's middle stored frame as JPEG bytes, for a page that shows hits.

The table's schema metadata (``vlp.index``, JSON, :class:`vlp.index.store.IndexInfo`) says how the rows were
made: the model directory and its fingerprint (family, kind, SHA-256 of its weights file), the frames store, the
feature size, the token shape, the clip sampling (``retrieval.num_frames``, ``eval_mode``, ``seed``) and the
precision the clips were encoded in (``retrieval.eval_precision``). Rows encoded by another model, from other
frames, sampled otherwise or in another precision do not compare with these, so adding them is refused
(:func:`vlp.index.store.check_compatible`); a search encodes its query in the index's precision. The clips are
encoded exactly as ``evaluate-retrieval`` encodes them (:mod:`vlp.inference`), so a search scores a query as
that step does.

From ``index.ann_min_rows`` rows on, ``vlp index`` also builds an approximate nearest-neighbour index on
``vector`` (IVF partitions with HNSW graphs over 8-bit quantised vectors, dot product), which the first stage then
uses, with the candidates re-scored on the stored vectors; below it, the first stage scans every row exactly.
"""

from vlp.index.store import ClipIndex, IndexInfo

__all__ = ["ClipIndex", "IndexInfo"]
