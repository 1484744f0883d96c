"""ALPRO (arXiv 2112.09583) as a vlp model family: ``spec`` registers it and holds its ``model.alpro`` config
section (no torch), ``model`` its modules and family object, ``importer`` the released checkpoints, ``prompts`` the
prompt bank PEM reads."""
