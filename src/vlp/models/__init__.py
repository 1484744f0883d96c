"""Model families (ALPRO, ALBEF, TS2-Net); shared building blocks live in ``vlp.models.layers``."""
