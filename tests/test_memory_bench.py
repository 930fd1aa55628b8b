"""bench/memory_bench.py at tiny scale on the CPU (issue 23 item 3): the same code the H200 runs, on the nano; it
measures no GPU figure here, so the test checks what it records and that every placement conditions alike."""

from __future__ import annotations

import json

import pytest

from bench.memory_bench import main


def test_memory_bench_runs_every_placement_on_the_nano(tmp_path):
    result = main(["--config", "tiny", "--device-memory-gib", "4", "--placements", "reload,resident,offload",
                   "--requests", "baseline@5,turbo@5:2", "--steps", "1", "--out", str(tmp_path)])
    assert list(result["placements"]) == ["resident", "offload", "reload"]  # reload runs last
    assert result["same_conditioning_every_placement"] is True  # reload read the conditioner from disk again
    assert result["plan"]["placement"] == "resident" and result["plan"]["requests"]["14.375 s"]["fits"]
    for placement, entry in result["placements"].items():
        # every tier under the first placement, the first tier under the others (one device call has 600 s)
        expected = ["baseline", "turbo"] if placement == "resident" else ["baseline"]
        assert [r["tier"] for r in entry["requests"]] == expected
        assert [r["steps"] for r in entry["requests"]] == [1, 2][:len(expected)]  # TIER@SECONDS:STEPS
        for record in entry["requests"]:
            assert record["stages"]["encode_text"] > 0 and record["tokens"] > 0
            assert record["peak_GiB_measured"] is None  # no GPU: nothing measured, nothing claimed
            assert record["peak_GiB_computed"] > 0 and record["peak_phase_computed"] in ("encode", "denoise", "decode")
    assert json.loads((tmp_path / "memory_bench.json").read_text())["config"] == "tiny"


def test_memory_bench_refuses_an_unknown_placement(tmp_path):
    with pytest.raises(SystemExit) as exited:
        main(["--config", "tiny", "--device-memory-gib", "4", "--placements", "swap", "--out", str(tmp_path)])
    assert exited.value.code == 2


def test_memory_bench_names_a_malformed_request(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--config", "tiny", "--device-memory-gib", "4", "--requests", "sol@five", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "'sol@five' is not TIER@SECONDS[:STEPS]" in capsys.readouterr().err
