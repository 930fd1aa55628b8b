"""A model's prompt guide: which words it was trained on, so a request can name the ones it will not understand.

The embedded h3-nano learnt from a small caption grammar (train/dataset.py). A word outside it reaches the
transformer as byte pieces it never saw, and what the word names is lost: asked for a "gray", "checkered" or "navy"
background, it drew another on 13 of 14 held-out prompts, while an unknown adjective changed little (TRAINING.md
§5k). So before anything runs, the engine can say "'checkered' is unknown to h3-nano (try 'textured')". A prompt is
never refused for this: a real checkpoint takes free text, and a reviewer may want to see what an unknown word does.

The guide is `prompt_guide.toml` in the model folder (written by `python -m train.prompt_guide`). A folder without
one (a real MiniMax-H3 checkpoint) has no guide and gets no notes. It is not part of the weights, so the model id
(which hashes .json and .safetensors files) does not change with it.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelLoadError

GUIDE_FILE = "prompt_guide.toml"
_WORD = re.compile(r"[a-z]+")
_LISTS = ("words", "colours", "shapes", "motion_words", "examples")
NOTE_WORDS = 12  # unknown words a note lists by name (a pasted paragraph would otherwise fill the screen)
# A typo's suggestion: a known word of 4+ letters, the same first letter, at most one letter longer or shorter, and
# this close by difflib's ratio ("squre" → "square", "circles" → "circle"); not "light" → "right", "top" → "to".
CLOSE_MATCH = 0.8


@dataclass(frozen=True)
class PromptCheck:
    """What a prompt says that the model may not understand. `unknown`: (word, suggestion or None) in prompt order;
    `missing`: the kinds of content the prompt names none of ("colour", "shape", "motion"); `suggestion`: the
    prompt with every unknown word replaced, when each has a replacement."""

    model: str
    unknown: list[tuple[str, str | None]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    suggestion: str | None = None

    @property
    def clean(self) -> bool:
        return not self.unknown and not self.missing

    def notes(self) -> list[str]:
        """One sentence per problem, for a person."""
        notes = []
        if self.unknown:
            words = ", ".join(f"'{w}'" + (f" (try '{s}')" if s else "") for w, s in self.unknown[:NOTE_WORDS])
            words += f" and {len(self.unknown) - NOTE_WORDS} more" if len(self.unknown) > NOTE_WORDS else ""
            notes.append(f"Unknown to {self.model}: {words}. It learnt only its training captions' words, so it "
                         "cannot follow what these name.")
        if self.missing:
            notes.append(f"Names no {', no '.join(self.missing)} that {self.model} knows, so it picks one itself "
                         "(unless a keyframe or reference image gives it).")
        return notes

    def to_dict(self) -> dict:
        return {"model": self.model, "clean": self.clean, "unknown_words": [w for w, _ in self.unknown],
                "replacements": {w: s for w, s in self.unknown if s}, "missing": self.missing,
                "suggestion": self.suggestion, "notes": self.notes()}


@dataclass(frozen=True)
class PromptGuide:
    """A model's caption vocabulary, its content words, example prompts and synonyms for common other words."""

    model: str
    words: frozenset[str]
    colours: frozenset[str]
    shapes: frozenset[str]
    motion_words: frozenset[str]
    examples: tuple[str, ...]
    synonyms: dict[str, str]

    @classmethod
    def load(cls, model_dir: str | Path, name: str) -> PromptGuide | None:
        """The folder's guide; None without one. A malformed guide stops the load with ModelLoadError naming it."""
        path = Path(model_dir) / GUIDE_FILE
        if not path.is_file():
            return None
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            lists = {key: data[key] for key in _LISTS}
            bad = [key for key, value in lists.items()
                   if not isinstance(value, list) or not all(isinstance(v, str) for v in value)]
            if bad:
                raise ValueError(f"{', '.join(bad)} must be lists of strings")
            synonyms = data.get("synonyms", {})
            if not isinstance(synonyms, dict) or not all(isinstance(v, str) for v in synonyms.values()):
                raise ValueError("[synonyms] must map words to strings")
        except KeyError as error:
            raise ModelLoadError(str(model_dir), [f"{GUIDE_FILE}: missing key {error}"]) from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as error:
            raise ModelLoadError(str(model_dir), [f"{GUIDE_FILE}: {error}"]) from None
        lower = {key: frozenset(w.lower() for w in lists[key]) for key in _LISTS if key != "examples"}
        return cls(model=str(data.get("model", name)), **lower, examples=tuple(lists["examples"]),
                   synonyms={k.lower(): v for k, v in synonyms.items()})  # prompts are matched in lower case

    def check(self, prompt: str, conditioned: bool = False) -> PromptCheck:
        """`conditioned`: a keyframe or reference image comes with the prompt (fl2va, ref2va) and may give the
        subject, so content the prompt leaves out is not reported."""
        words = _WORD.findall(prompt.lower())
        unknown: list[tuple[str, str | None]] = []
        for word in dict.fromkeys(w for w in words if w not in self.words):  # each once, in prompt order
            unknown.append((word, self.synonyms.get(word) or self._typo_of(word)))
        named = set(words) | {w for _, s in unknown if s for w in s.split()}  # a synonym names what it stands for
        missing = [] if conditioned else [
            kind for kind, vocab in (("colour", self.colours), ("shape", self.shapes), ("motion", self.motion_words))
            if not named & vocab]
        suggestion = None
        if unknown and all(s for _, s in unknown):
            replace = dict(unknown)
            suggestion = re.sub(r"[A-Za-z]+", lambda m: _same_case(m.group(0), replace.get(m.group(0).lower())),
                                prompt)
        return PromptCheck(self.model, unknown, missing, suggestion)

    def _typo_of(self, word: str) -> str | None:
        """The known word `word` most likely misspells (CLOSE_MATCH), or None."""
        near = [w for w in sorted(self.words) if len(w) >= 4 and w[0] == word[0] and abs(len(w) - len(word)) <= 1]
        close = difflib.get_close_matches(word, near, n=1, cutoff=CLOSE_MATCH)
        return close[0] if close else None


def _same_case(word: str, replacement: str | None) -> str:
    if replacement is None:
        return word
    return replacement[:1].upper() + replacement[1:] if word[:1].isupper() else replacement
