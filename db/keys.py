"""Canonical JSON and the content keys derived from it; the ids and timestamps rows are made with.

Configuration keys and tier-config hashes must be identical across processes and restarts, so they hash a
canonical JSON form (sorted keys, no whitespace, UTF-8) rather than Python's repr.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

from db.errors import StoreError


def canonical_json(value: Any, field: str = "value") -> str:
    """Serialise ``value`` deterministically; raise StoreError(field) if it is not plain JSON data."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(field, f"must be JSON-serialisable data (dict/list/str/number/bool/null): {exc}") from exc


def sha256_hex(data: bytes | str) -> str:
    """Hex sha256 of bytes, or of a string encoded as UTF-8."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def tier_config_hash(tier_config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a tier configuration (used to find a reusable baseline clip)."""
    if not isinstance(tier_config, dict):
        raise StoreError("tier_config", "must be a dict of tier parameters")
    return sha256_hex(canonical_json(tier_config, "tier_config"))


def with_tier_name(tier_config: dict[str, Any], tier_name: str | None) -> dict[str, Any]:
    """Return the tier config with its name folded in under ``"name"``.

    Why: a configuration is model + tier name + tier parameters + duration; keeping the name inside the
    snapshot means one dict describes the tier completely, and the key cannot depend on argument order.
    """
    if not isinstance(tier_config, dict):
        raise StoreError("tier_config", "must be a dict of tier parameters")
    if tier_name is None:
        return dict(tier_config)
    existing = tier_config.get("name")
    if existing is not None and existing != tier_name:
        raise StoreError("tier_name", f"{tier_name!r} does not match tier_config['name'] = {existing!r}")
    return {**tier_config, "name": tier_name}


def normalise_duration(duration: Any, field: str = "duration_seconds") -> float:
    """Validate a duration in seconds and return it as a float (5 and 5.0 must give the same key)."""
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise StoreError(field, "must be a number of seconds")
    value = float(duration)
    if not math.isfinite(value) or value <= 0:
        raise StoreError(field, "must be a finite number of seconds > 0")
    return value


def configuration_key(
    model_id: str, tier_config: dict[str, Any], duration: float, *, tier_name: str | None = None
) -> str:
    """Key of a configuration: sha256 of canonical {model_id, tier_config, duration_seconds}.

    ``tier_name``, when given, is folded into the tier config as ``"name"`` (what :meth:`Store.create_pair`
    does), so ``configuration_key(m, cfg, d, tier_name=t)`` equals the key stored for a pair of tier ``t``.
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise StoreError("model_id", "must be a non-empty string")
    payload = {
        "model_id": model_id,
        "tier_config": with_tier_name(tier_config, tier_name),
        "duration_seconds": normalise_duration(duration),
    }
    return sha256_hex(canonical_json(payload, "tier_config"))


def new_id(prefix: str) -> str:
    """Public ids look like SGLang's: ``video_<32 hex>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def utc_now() -> datetime:
    """Current time as naive UTC (the storage form)."""
    return datetime.now(UTC).replace(tzinfo=None)
