import numpy as np

from train.samples import GAP, sheet


def test_sheet_puts_every_nth_frame_of_each_clip_in_its_own_row():
    clips = [np.full((5, 4, 6, 3), 0, np.uint8), np.full((3, 4, 6, 3), 0, np.uint8)]
    for c, clip in enumerate(clips):
        for t in range(len(clip)):
            clip[t] = 10 * c + t  # each frame its own value
    out = sheet(clips, every=2)
    # row 1: frames 0, 2, 4; row 2: frames 0, 2 (then white); rows and frames 2 px apart
    assert out.shape == (4 + GAP + 4, 3 * 6 + 2 * GAP, 3)
    assert [int(out[0, i * (6 + GAP), 0]) for i in range(3)] == [0, 2, 4]
    assert [int(out[4 + GAP, i * (6 + GAP), 0]) for i in range(2)] == [10, 12]
    assert (out[4 + GAP:, 2 * (6 + GAP):] == 255).all()
    assert (out[4: 4 + GAP] == 255).all()
