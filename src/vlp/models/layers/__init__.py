"""Reusable model layers: BERT's (``bert``), ViT's parts (``blocks``) and CLIP's towers (``clip``), each written here
with transformers' or timm's names, random draws and arithmetic (their tests compare them bit for bit), the
TimeSformer video encoder (``timesformer``), a frame ViT (``vit``), cross-attention fusion (``cross``), token shift
(``shift``), top-k token selection (``topk``) and the attention they all call (``attention``: torch's kernel, explicit
matmuls for bf16 on the CPU). Import each from its module: this package imports none of them, so
a family loads the layers it uses alone."""
