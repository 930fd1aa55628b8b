"""Issue 40: the nano's held-out list, its dev and test sets, and the shape classifier that can say "unknown".

The trainer draws every clip and caption from content_tuples("train") (sample_specs, the task table, the caption ids
of the latent dataset), so these checks hold for the next training run; the figures come from train.evaluate.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train import configs
from train.dataset import (
    BACKGROUNDS,
    COLOURS,
    HELD_OUT,
    HELD_OUT_PAIRS,
    MOTIONS,
    SHAPES,
    content_tuples,
    held_out_pair,
    make_spec,
    render_video,
    sample_specs,
)
from train.eval_sets import build, load
from train.shape_classifier import UNKNOWN, confusion, read_shape


def _forbidden(content) -> bool:
    return tuple(content[:3]) in HELD_OUT or held_out_pair(tuple(content)) is not None


def test_the_trainers_samplers_never_produce_a_held_out_pair_or_triple():
    from train.tasks import plan_samples
    from train.text_conditioning import labelled_captions

    assert not [t for t in content_tuples("train") if _forbidden(t)]
    # The latent dataset's clips (train/latents.py: SEED + 5, --num-clips up to 3200) and other seeds.
    for seed, count in ((configs.SEED + 5, 3200), (1, 500), (2**31 - 2, 500)):
        assert not [s for s in sample_specs(seed, count, "train") if _forbidden((s.colour, s.shape, s.motion,
                                                                                 s.background))]
    # The fl2va/ref2va task table (its subject-free prompts name no subject, but their clips still do).
    assert not [s for s in plan_samples(300, 100) if _forbidden((s["spec"].colour, s["spec"].shape, s["spec"].motion,
                                                                 s["spec"].background))]
    # The text encoder's training captions: none names a held-out pair.
    texts, labels = labelled_captions("train")
    vocab = (list(COLOURS), list(SHAPES), list(MOTIONS), list(BACKGROUNDS))
    assert not [t for t, row in zip(texts, labels.tolist()) if _forbidden([v[i] for v, i in zip(vocab, row)])]


def test_every_held_out_value_still_meets_other_partners_in_training():
    train = content_tuples("train")
    for position, vocabulary in enumerate((COLOURS, SHAPES, MOTIONS, BACKGROUNDS)):
        assert {t[position] for t in train} == set(vocabulary)
    for pair in HELD_OUT_PAIRS:  # each side of a pair trains with every other partner of the pair's kind
        first, second = {"colour_motion": (0, 2), "shape_motion": (1, 2), "shape_background": (1, 3)}[pair.kind]
        assert {t[second] for t in train if t[first] == pair.values[0]} >= {
            v for v in (MOTIONS if second == 2 else BACKGROUNDS) if v != pair.values[1]} - {
            p.values[1] for p in HELD_OUT_PAIRS if p.kind == pair.kind and p.values[0] == pair.values[0]}


def test_runs_1_to_10_saw_every_pair_now_held_out():
    """Why the shipped nano's composition figures are not composition: its training clips held every pair."""
    clips = sample_specs(configs.SEED + 5, 1600, "runs1to10_train")  # run 10's stage 21: --num-clips 1600
    seen = {(s.colour, s.shape, s.motion, s.background) for s in clips}
    for pair in HELD_OUT_PAIRS:
        assert any(pair.holds(t) for t in seen), pair


def test_dev_and_test_sets_are_declared_apart_and_ask_for_what_is_held_out():
    dev, test = load("dev"), load("test")
    assert dev == build("dev") and test == build("test")  # the files are what train.eval_sets --write declares
    test_pairs = [p for p in HELD_OUT_PAIRS if p.set == "test"]
    dev_pairs = [p for p in HELD_OUT_PAIRS if p.set == "dev"]
    assert test_pairs and dev_pairs and {p.kind for p in test_pairs} == {"colour_motion", "shape_motion",
                                                                         "shape_background"}
    for item in dev:
        assert not any(p.holds(item.content) for p in test_pairs), item.id
    for pair in test_pairs:
        assert [i for i in test if i.group == pair.kind and pair.holds(i.content)], pair
    for pair in dev_pairs:
        assert [i for i in dev if i.group == pair.kind and pair.holds(i.content)], pair
    for item in test:
        if item.group in ("colour_motion", "shape_motion", "shape_background"):
            assert held_out_pair(item.content) is not None and held_out_pair(item.content).set == "test"
    assert not {(i.prompt, i.seed) for i in dev} & {(i.prompt, i.seed) for i in test}
    ids = {i.id for i in test}
    assert all(i.of in ids for i in test if i.tier == "turbo")
    from train.verify_nano import SEED, held_out_prompts

    legacy = [(c, p, SEED) for c, p in held_out_prompts(40) if not any(t.holds(c) for t in test_pairs)]
    assert [(i.content, i.prompt, i.seed) for i in dev if i.group == "legacy"] == legacy[:12]


def test_a_test_set_is_scored_once_per_model(tmp_path):
    from train.evaluate import refuse_second_test_score

    out = tmp_path / "test_model.json"
    refuse_second_test_score("test", out)
    out.write_text("{}")
    with pytest.raises(SystemExit, match="scored once"):
        refuse_second_test_score("test", out)
    refuse_second_test_score("dev", out)  # the dev set is scored as often as wanted


def _masks(shape: str, blur: float = 0.0) -> list[np.ndarray]:
    import cv2

    spec = make_spec(("white", shape, "left to right", "black"), seed=3)
    _, coverage = render_video([spec], torch.arange(10, 124, 20), with_mask=True)
    return [(cv2.GaussianBlur(m, (0, 0), blur) if blur else m) > 0.5 for m in coverage[0].numpy()]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blur", [0.0, 3.0])
def test_shape_classifier_names_rendered_and_blurred_shapes(shape, blur):
    reading = read_shape(_masks(shape, blur))
    assert reading.label == shape and reading.confidence >= 0.05, reading


def test_shape_classifier_says_unknown_between_shapes_and_for_broken_masks():
    import cv2

    # A 50-px square with each corner cut a quarter of the side in: as round as it is square.
    side, cut, x, y = 50, 12, 75, 35
    corners = [[x + cut, y], [x + side - cut, y], [x + side, y + cut], [x + side, y + side - cut],
               [x + side - cut, y + side], [x + cut, y + side], [x, y + side - cut], [x, y + cut]]
    between = np.zeros((128, 224), np.uint8)
    cv2.fillPoly(between, [np.array(corners, np.int32)], 1)
    reading = read_shape([between.astype(bool)] * 5)
    assert reading.label == UNKNOWN and "margin" in reading.reason, reading
    broken = [m.copy() for m in _masks("circle")]
    for m in broken:  # a comb: the subject cut by stripes
        ys, xs = np.nonzero(m)
        m[:, xs.min():xs.max():4] = False
    assert read_shape(broken).label == UNKNOWN
    assert read_shape([None, np.zeros((128, 224), bool)]).label == UNKNOWN
    table = confusion(["circle", "square", "square"], ["circle", UNKNOWN, "circle"])
    assert table["square"] == {"circle": 1, "square": 0, "triangle": 0, UNKNOWN: 1}
