"""A search candidate saved as a named tier in a tiers file (`python app.py --tiers-file FILE` loads it).

The tier is a `[[tier]]` table with TierSpec's fields, read by engine.tiers.TierTable.load, the loader app.py's
engine uses; its search record (which search, which candidate, its knobs, measured and modelled cost, the gates'
figures per case, the review campaign and the configuration's verdict tally) goes in a `[search_record.<tier>]`
table beside it, which that loader does not read (it reads only `tier`), so the tiers file stays loadable by any
studio. A file that exists is appended to, never rewritten: a hand-written file keeps its comments and layout.

    tier_toml(tier) / record_toml(name, record)   the TOML text
    save_tier(path, tier, record)                 append both, refusing a name the file already has
    search_records(path)                          {tier name: record} of a tiers file
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from engine import RequestError, TierSpec, TierTable, check_tier, spec_from_table

__all__ = ["check_tier", "file_form", "record_toml", "save_tier", "search_records", "tier_from_dict", "tier_toml"]

RECORDS = "search_record"


def tier_from_dict(data: dict[str, Any]) -> TierSpec:
    """TierSpec.to_dict()'s output back into a TierSpec (through the tiers file's own table reader)."""
    table = {key: value for key, value in data.items() if value is not None}
    return spec_from_table(table)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() and key.isascii() else json.dumps(key)


def tier_toml(tier: TierSpec) -> str:
    """The `[[tier]]` table of `tier`: every field that differs from TierSpec's default, techniques as tables."""
    lines = ["[[tier]]"]
    nested = []
    for item in fields(tier):
        value = getattr(tier, item.name)
        if value is None or (item.name == "max_duration" and math.isinf(value)):
            continue
        if is_dataclass(value):
            nested.append((item.name, {f.name: getattr(value, f.name) for f in fields(value)}))
        else:
            lines.append(f"{item.name} = {_value(value)}")
    for name, table in nested:
        lines.append(f"[tier.{name}]")
        lines.extend(f"{key} = {_value(value)}" for key, value in table.items() if value is not None)
    return "\n".join(lines) + "\n"


def record_toml(name: str, record: dict[str, Any]) -> str:
    """`[search_record.<name>]` with the record's keys (nested values as inline tables and arrays)."""
    lines = [f"[{RECORDS}.{_key(name)}]"]
    lines.extend(f"{_key(key)} = {_value(value)}" for key, value in record.items() if value is not None)
    return "\n".join(lines) + "\n"


def search_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """{tier name: its search record} of a tiers file ({} when it has none)."""
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RequestError("tiers_file", f"cannot read {Path(path).name}: {error}") from None
    return dict(document.get(RECORDS, {}))


def _clean(value: Any) -> Any:
    """A record without None (TOML has no null): dropped from tables, "" in arrays."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return ["" if v is None else _clean(v) for v in value]
    return value


def file_form(tier: TierSpec) -> TierSpec:
    """`tier` as a tiers file must state it: a LoRA's path absolute (a relative one would resolve against the
    file's folder, not assets/loras)."""
    if tier.lora is not None and not Path(tier.lora.path).is_absolute():
        return replace(tier, lora=replace(tier.lora, path=str(tier.lora.resolved().resolve())))
    return tier


def save_tier(path: str | Path, tier: TierSpec, record: dict[str, Any]) -> None:
    """Append `tier` and its search record to the tiers file at `path` (created if missing). Refused, naming
    `name`, when the file (or the built-in table) already has a tier of that name; the file is checked to load
    through TierTable.load with the new tier before it is replaced (written to a temporary file, then renamed)."""
    tier = file_form(tier)
    check_tier(tier)
    record = _clean(record)
    path = Path(path)
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        before = TierTable.load(path if existing else None)
    except RequestError as error:
        raise RequestError("tiers_file", f"{path.name} does not load now: {error.field}: {error.message}") from None
    if tier.name in before.tiers:
        raise RequestError("name", f"a tier named {tier.name!r} exists in {path.name} or the built-in table: "
                           "pick another name")
    text = existing + ("\n" if existing and not existing.endswith("\n") else "") + \
        ("\n" if existing else "# Tiers saved from configuration searches (H3 Review Studio); load with "
                               "--tiers-file.\n\n") + tier_toml(tier) + "\n" + record_toml(tier.name, record)
    temporary = path.with_name(f".{path.name}.saving")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary.write_text(text, encoding="utf-8")
    try:
        loaded = TierTable.load(temporary)  # the file app.py would load, checked before it replaces the old one
        if loaded.get(tier.name) != tier:
            raise RequestError("tier", f"{tier.name!r} did not read back as written")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
