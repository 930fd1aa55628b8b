"""Configs of the embedded "h3-nano" default: the real MiniMax-H3 architecture at toy size.

These dicts are the source that `assets/make_nano.py` writes into `assets/nano/*/config.json`. Runtime code
loads the JSON from disk, never these dicts, so a retrained nano can change them.
"""

NANO_TRANSFORMER = dict(
    num_attention_heads=2,
    attention_head_dim=32,
    hidden_size=64,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=128,
    in_channels=4,
    audio_in_channels=8,
    patch_size=(1, 2, 2),
    text_dim=32,
    freq_dim=32,
    time_embed_hidden_dim=64,
    time_embed_dim=32,
    rope_freq_dim=4,
)
