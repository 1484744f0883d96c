"""TS2-Net (arXiv 2207.07852) as a vlp model family: ``spec`` registers it and holds its ``model.ts2net`` config
section (no torch), ``model`` its modules and family object, ``importer`` the released checkpoints."""
