"""The nano's prompt guide (engine/prompt_guide.py): the words its captions use, and what a prompt says beyond them.

The shipped guide must be what train/dataset.py gives (regenerated, not hand-edited); every example and every prompt
of the held-out suite must pass it; a word outside the captions is named, with a replacement where one is known; a
broken guide stops the load naming the file; and the guide never changes the model id.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.components import NANO_PATH, model_id_for
from engine.errors import ModelLoadError
from engine.prompt_guide import GUIDE_FILE, PromptGuide
from train import prompt_guide as writer
from train.dataset import all_captions

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def guide() -> PromptGuide:
    loaded = PromptGuide.load(NANO_PATH, "h3-nano")
    assert loaded is not None
    return loaded


def test_the_shipped_guide_and_suite_are_what_the_dataset_gives(capsys):
    assert writer.main(["--check"]) == 0, capsys.readouterr().err


def test_every_training_caption_example_and_suite_prompt_is_clean(guide):
    assert all(guide.check(caption).clean for caption in all_captions())
    suite = (ROOT / "assets" / "prompts" / "nano_heldout.txt").read_text().splitlines()
    prompts = [line for line in suite if line and not line.startswith("#")]
    assert len(prompts) == 40 and all(guide.check(p).clean for p in prompts)
    assert guide.examples and all(guide.check(p).clean for p in guide.examples)


def test_every_synonym_stands_for_caption_words(guide):
    assert guide.synonyms
    for word, target in guide.synonyms.items():
        assert word not in guide.words and set(target.split()) <= guide.words, (word, target)


def test_unknown_words_are_named_with_a_replacement_where_one_is_known(guide):
    check = guide.check("Checkered background, a blue squre is sliding to the left")
    assert check.unknown == [("checkered", "textured"), ("squre", "square"), ("sliding", "slides")]
    assert check.suggestion == "Textured background, a blue square is slides to the left"  # case kept
    assert check.missing == []
    notes = " ".join(check.notes())
    assert "'checkered' (try 'textured')" in notes and "cannot follow" in notes


@pytest.mark.parametrize("word, replacement", [
    ("circles", "circle"), ("move", "moves"), ("trianlge", "triangle"), ("gren", "green"), ("an", "a"),
    ("light", None), ("top", None), ("orange", None),  # a different word is not a typo of a known one
])
def test_typos_and_plurals_get_the_known_word_other_words_none(guide, word, replacement):
    assert guide.check(f"a red square {word}").unknown == [(word, replacement)]


def test_a_word_without_a_replacement_gets_no_rewrite(guide):
    check = guide.check("a red kite dips over a windy beach")
    assert [w for w, _ in check.unknown] == ["kite", "dips", "windy", "beach"]
    assert check.suggestion is None
    assert check.missing == ["shape", "motion"]  # "red" is a colour it knows
    assert check.to_dict()["unknown_words"] == ["kite", "dips", "windy", "beach"]


def test_a_long_prompt_names_its_first_unknown_words_and_counts_the_rest(guide):
    words = [f"word{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(40)]
    check = guide.check(" ".join(words))
    note = check.notes()[0]
    assert len(check.unknown) == 40 and f"'{words[11]}'" in note and f"'{words[12]}'" not in note
    assert "and 28 more" in note


def test_a_prompt_in_its_words_that_names_no_subject_is_told_so(guide):
    check = guide.check("A shape moves up on a grey background.")  # the ref2va captions' wording
    assert check.unknown == [] and check.missing == ["colour", "shape"] and not check.clean
    assert guide.check("A shape moves up on a grey background.", conditioned=True).clean  # the image gives it
    assert guide.check("a red circle moves left to right").clean


def test_a_folder_without_a_guide_has_none(tmp_path):
    assert PromptGuide.load(tmp_path, "x") is None


@pytest.mark.parametrize("text, problem", [
    ("words = [", "prompt_guide.toml"),
    ('colours = []\nshapes = []\nmotion_words = []\nexamples = []', "missing key 'words'"),
    ('words = "a b"\ncolours = []\nshapes = []\nmotion_words = []\nexamples = []', "words must be lists"),
    ('words = []\ncolours = []\nshapes = []\nmotion_words = []\nexamples = []\nsynonyms = 3', "[synonyms]"),
])
def test_a_broken_guide_stops_the_load_naming_the_file(tmp_path, text, problem):
    (tmp_path / GUIDE_FILE).write_text(text)
    with pytest.raises(ModelLoadError) as raised:
        PromptGuide.load(tmp_path, "x")
    assert GUIDE_FILE in str(raised.value) and problem in str(raised.value)


def test_the_guide_is_not_part_of_the_model_id(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(NANO_PATH / "h3_studio.json", folder / "h3_studio.json")
    before = model_id_for(folder)
    shutil.copy(NANO_PATH / GUIDE_FILE, folder / GUIDE_FILE)
    assert model_id_for(folder) == before


def test_the_engine_reads_the_guide_of_its_model(nano_engine):
    assert nano_engine.prompt_guide is not None and nano_engine.prompt_guide.model == "h3-nano"


def test_the_vocabulary_check_runs_each_way_through_the_engine(nano_engine):
    """verify_nano's vocabulary check (TRAINING.md §5k) on one held-out prompt at 1 step: the prompt as captioned,
    with an unknown adjective and with a background synonym, each named by the guide."""
    from train.verify_nano import Clips, check_vocabulary, held_out_prompts, vocabulary_variants

    content, prompt = held_out_prompts(1)[0]
    assert vocabulary_variants(("red", "square", "up", "grey"), "a red square moves up on a grey background", 1) == {
        "adjective": "a red bright square moves up on a grey background",
        "synonym": "a red square moves up on a gray background"}
    result = check_vocabulary(Clips(nano_engine, steps=1), 1)
    row = result["per_prompt"][0]
    assert row["captioned"]["prompt"] == prompt and row["captioned"]["unknown_named"] == []
    assert row["adjective"]["unknown_named"] == ["small"]
    assert ("synonym" in row) == (content[3] != "black")
    assert set(result["captioned"]) == {"followed", "shape", "background"} and result["pass"] is None


def test_the_background_reader_names_each_rendered_background():
    import torch

    from train.dataset import render_video, sample_specs
    from train.metrics import nearest_background

    specs = sample_specs(3, 12, "train")
    clips = render_video(specs, torch.arange(0, 124, 8)).numpy()
    assert {s.background for s in specs} == {"black", "grey", "dark blue", "textured"}
    assert [nearest_background(clip) for clip in clips] == [s.background for s in specs]
