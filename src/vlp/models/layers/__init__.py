"""Reusable model layers: the TimeSformer video encoder (``timesformer``), a frame ViT (``vit``), cross-attention
fusion (``cross``), token shift (``shift``) and top-k token selection (``topk``). Import each from its module: this
package imports none of them, so a family that needs token shift does not load timm's ViT layers with it."""
