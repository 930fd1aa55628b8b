import json
import os

import cv2
import numpy as np

from engine import Engine
from quality import ClipData, compare_clips

eng = Engine.load()
prompts = ["A video of a green circle that slides right to left over a dark blue backdrop",
           "a red square moves from right to left on a black background",
           "a white triangle moves from left to right on a textured background"]
SEED = int(os.environ.get("SEED", 42))  # seed 42 made the strips beside this file
OUT = os.environ.get("OUT", "/tmp")
out = {}
for i, prompt in enumerate(prompts):
    base = eng.generate({"prompt": prompt, "seed": SEED})
    for tier in ("turbo", "sol"):
        cand = eng.generate({"prompt": prompt, "seed": SEED, "tier": tier})
        b, c = np.asarray(base.frames, np.uint8), np.asarray(cand.frames, np.uint8)
        s = compare_clips(ClipData(b, 24.0), ClipData(c, 24.0), lpips=False).summary()
        idx = list(range(0, len(b), 20))
        strip = np.concatenate([np.concatenate(list(b[idx]), 1), np.concatenate(list(c[idx]), 1)], 0)
        name = f"p{i}_{tier}"
        cv2.imwrite(f"{OUT}/strip_{name}.png", cv2.cvtColor(strip, cv2.COLOR_RGB2BGR))
        out[name] = {"verdict": s["suggested_verdict"], "reasons": s["suggestion_reasons"][:3],
                     "lost": s.get("subject_lost_frames"), "present": s.get("subject_present")}
        print(name, json.dumps(out[name]), flush=True)
json.dump(out, open(f"{OUT}/strips_verdicts.json", "w"), indent=1)
