"""Data: manifests, video decoding, the synthetic world, ingest, frame extraction, entity mining."""
