"""ALBEF (arXiv 2107.07651) as a vlp model family: ``spec`` registers it and holds its ``model.albef`` config
section (no torch), ``model`` its modules and family object, ``importer`` the released checkpoints."""
