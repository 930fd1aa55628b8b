"""Widen a trained nano's video latent (C → C' channels) without changing what it already does.

Run 4 showed the 8-channel ×16 latent itself loses the shapes (a decoder trained alone kept 6/24 on a round trip),
so run 5 gives the video VAE more latent channels. Training a VAE and a transformer from scratch again would cost
most of a session's GPU time, so both are widened in place ("net2net"): the new channels start with no effect on the
output, and training teaches them the detail the old ones drop.

- Video VAE: the encoder's new mean rows keep their fresh random init (so they carry *something* and gradients
  flow), new log-variance rows copy old ones; `quant_conv` and `post_quant_conv` act as identity on the new
  channels; `decoder.proj_in` has zero columns for them, so a widened VAE decodes exactly as before.
- Transformer: rows are packed channel-major (`c·4 + ph·2 + pw`, train/flow.py `patchify`), so old features keep
  their indices; `proj_in` gets zero columns and `proj_out` zero rows for the new ones.

`tests/test_train.py` checks that both widened models reproduce the originals' outputs exactly.
"""

from __future__ import annotations

import torch

PATCH = 4  # 1 x 2 x 2 features per latent channel in a transformer row


def _old_channels(state: dict, key: str, axis: int, per_channel: int = 1) -> int:
    return state[key].shape[axis] // per_channel


def widen_video_vae(state: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint `state` (C channels) → a state dict for the wider module whose own init is `fresh` (C')."""
    c = _old_channels(state, "post_quant_conv.weight", 0)
    n = _old_channels(fresh, "post_quant_conv.weight", 0)
    if n == c:
        return state
    if n < c:
        raise ValueError(f"video latent channels: the checkpoint has {c}, cannot narrow to {n}")
    out = dict(state)
    moments = torch.cat([torch.arange(c), n + torch.arange(c)])  # old (mean, logvar) rows in the wide layout
    for key in ("encoder.conv_out.weight", "encoder.conv_out.bias"):
        wide = fresh[key].clone()
        wide[moments] = state[key]
        wide[n + c:] = state[key][c + torch.arange(n - c) % c]  # new log-variances start like old ones
        out[key] = wide
    wide = torch.zeros_like(fresh["quant_conv.weight"])
    wide[moments[:, None], moments[None, :]] = state["quant_conv.weight"]
    new = torch.cat([torch.arange(c, n), n + torch.arange(c, n)])
    wide[new, new] = 1.0
    out["quant_conv.weight"] = wide
    bias = torch.zeros_like(fresh["quant_conv.bias"])
    bias[moments] = state["quant_conv.bias"]
    out["quant_conv.bias"] = bias
    wide = torch.zeros_like(fresh["post_quant_conv.weight"])
    wide[:c, :c] = state["post_quant_conv.weight"]
    wide[torch.arange(c, n), torch.arange(c, n)] = 1.0
    out["post_quant_conv.weight"] = wide
    bias = torch.zeros_like(fresh["post_quant_conv.bias"])
    bias[:c] = state["post_quant_conv.bias"]
    out["post_quant_conv.bias"] = bias
    wide = torch.zeros_like(fresh["decoder.proj_in.weight"])
    wide[:, :c] = state["decoder.proj_in.weight"]
    out["decoder.proj_in.weight"] = wide
    return out


def widen_transformer(state: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Transformer checkpoint with C video channels → one for C' (zero weights on the new features)."""
    c = _old_channels(state, "proj_out.weight", 0, PATCH)
    n = _old_channels(fresh, "proj_out.weight", 0, PATCH)
    if n == c:
        return state
    if n < c:
        raise ValueError(f"transformer in_channels: the checkpoint has {c}, cannot narrow to {n}")
    out = dict(state)
    wide = torch.zeros_like(fresh["proj_in.weight"])
    wide[:, :PATCH * c] = state["proj_in.weight"]
    out["proj_in.weight"] = wide
    for key in ("proj_out.weight", "proj_out.bias"):
        wide = torch.zeros_like(fresh[key])
        wide[:PATCH * c] = state[key]
        out[key] = wide
    return out
