"""Synced playback of the two compare videos from one clock (Gradio has no synced video slider, issue #11299).

A ``gr.HTML`` control bar whose ``js_on_load`` drives the two ``<video>`` elements inside the compare tab's
``gr.Video`` components (found by elem_id). One clock (``performance.now()``) decides the time; every animation
frame each video is pulled back to the clock when it drifts more than a frame, so decoder stalls on either side
never let the clips run apart. The frame slider seeks both through ``window.h3Player.seekFrame``; during
playback the slider shows the frame on screen (its inputs only: the per-frame handler runs once, on pause), and on
pause it moves to the shown frame through its handler.
"""

from __future__ import annotations

BASELINE_VIDEO_ID = "h3-video-baseline"
CANDIDATE_VIDEO_ID = "h3-video-candidate"
FRAME_SLIDER_ID = "h3-frame-slider"

PLAYER_HTML = """
<div class="h3-player">
  <button data-act="play" title="Play both clips from one clock">▶ Play both</button>
  <button data-act="pause" title="Pause both">Pause</button>
  <button data-act="back" title="One frame back">◀ frame</button>
  <button data-act="fwd" title="One frame forward">frame ▶</button>
  <button data-act="restart" title="Back to frame 0">⟲ Start</button>
  <label>speed <select data-act="rate"><option value="0.25">0.25×</option><option value="0.5">0.5×</option>
    <option value="1" selected>1×</option></select></label>
  <label>sound <select data-act="sound"><option value="baseline" selected>baseline</option>
    <option value="candidate">candidate</option><option value="none">muted</option></select></label>
  <label><input type="checkbox" data-act="loop" checked> loop</label>
  <span class="h3-clock">t 0.000 s · frame 0 · drift —</span>
</div>
"""

PLAYER_CSS = """
.h3-player { display:flex; flex-wrap:wrap; gap:6px; align-items:center; padding:6px 8px;
  border:1px solid var(--border-color-primary); border-radius:8px; background:var(--block-background-fill); }
.h3-player button { padding:3px 10px; border-radius:6px; border:1px solid var(--border-color-primary);
  background:var(--button-secondary-background-fill); cursor:pointer; }
.h3-player .h3-clock { font-family:monospace; margin-left:auto; }
"""

# %-formatted rather than str.format/f-string: the script is full of braces.
PLAYER_JS = """
const FPS = 24;
const ids = ['%(baseline)s', '%(candidate)s'];
const state = {playing: false, offset: 0, t0: 0, rate: 1, sound: 'baseline', loop: true};
let sliderFrame = null;  // the frame the slider's Python handler last saw
const clock = element.querySelector('.h3-clock');
const videos = () => ids.map(id => document.querySelector('#' + id + ' video'));
const now = () => state.playing ? state.offset + (performance.now() - state.t0) / 1000 * state.rate : state.offset;
const length = () => {
  const d = videos().filter(Boolean).map(v => v.duration).filter(x => isFinite(x) && x > 0);
  return d.length ? Math.min(...d) : 0;
};
function applySound() {
  videos().forEach((v, i) => { if (v) v.muted = state.sound !== ['baseline', 'candidate'][i]; });
}
function show(t) {
  const v = videos().filter(Boolean);
  const drift = v.length === 2 ? Math.abs(v[0].currentTime - v[1].currentTime) * 1000 : NaN;
  clock.textContent = `t ${t.toFixed(3)} s · frame ${Math.floor(t * FPS)} · drift ` +
    (isNaN(drift) ? '—' : drift.toFixed(0) + ' ms');
}
function showOnSlider(t) {
  // During playback: the slider's inputs show the frame on screen without their events, so the per-frame
  // handler does not run 24 times a second; Gradio draws the track's fill from --range_progress.
  const box = document.querySelector('#%(slider)s');
  if (!box) return;
  const range = box.querySelector('input[type=range]');
  const number = box.querySelector('input[type=number]');
  const max = range ? Number(range.max) : Infinity;
  const f = Math.min(Math.floor(t * FPS), max);
  if (number && document.activeElement !== number) number.value = f;
  if (range) {
    const min = Number(range.min) || 0;
    range.value = f;
    range.style.setProperty('--range_progress', (max > min ? (f - min) / (max - min) * 100 : 0) + '%%');
  }
}
function place(t) {
  videos().forEach(v => { if (v && Math.abs(v.currentTime - t) > 0.5 / FPS) v.currentTime = t; });
  show(t);
}
function tick() {
  if (!state.playing) return;
  let t = now();
  const d = length();
  if (d && t >= d) {
    if (state.loop) { state.offset = 0; state.t0 = performance.now(); t = 0; }
    else { pause(); return; }
  }
  videos().forEach(v => {
    if (!v) return;
    if (Math.abs(v.currentTime - t) > 1 / FPS) v.currentTime = t;  // pull a drifting side back to the clock
    v.playbackRate = state.rate;
    if (v.paused) v.play().catch(() => {});
  });
  show(t);
  showOnSlider(t);
  requestAnimationFrame(tick);
}
function play() {
  if (state.playing) return;
  applySound();
  state.t0 = performance.now();
  state.playing = true;
  place(state.offset);
  requestAnimationFrame(tick);
}
function pause() {
  if (!state.playing) return;
  state.offset = now();
  state.playing = false;
  videos().forEach(v => v && v.pause());
  // Show a whole frame and move the frame slider there, so the still views match what was on screen.
  seekFrame(Math.min(Math.floor(state.offset * FPS), Math.max(0, Math.round(length() * FPS) - 1)), true);
}
function seekFrame(f, moveSlider) {
  state.offset = (Number(f) + 0.5) / FPS;  // mid-frame: never lands on a frame boundary
  if (state.playing) { state.t0 = performance.now(); }
  place(state.offset);
  if (moveSlider) {
    const input = document.querySelector('#%(slider)s input[type=number]');
    if (input && sliderFrame !== Number(f)) {  // not the input's value: playback has been writing it
      sliderFrame = Number(f);
      input.value = f;
      input.dispatchEvent(new Event('input', {bubbles: true}));
      input.dispatchEvent(new Event('change', {bubbles: true}));
      input.dispatchEvent(new Event('blur', {bubbles: true}));
    }
  }
}
function step(delta) {
  if (state.playing) pause();
  seekFrame(Math.max(0, Math.floor(state.offset * FPS) + delta), true);
}
element.addEventListener('click', e => {
  const act = e.target.dataset && e.target.dataset.act;
  if (act === 'play') play();
  else if (act === 'pause') pause();
  else if (act === 'back') step(-1);
  else if (act === 'fwd') step(1);
  else if (act === 'restart') { const p = state.playing; if (p) pause(); seekFrame(0, true); if (p) play(); }
});
element.addEventListener('change', e => {
  const act = e.target.dataset && e.target.dataset.act;
  if (act === 'rate') { state.offset = now(); state.t0 = performance.now(); state.rate = Number(e.target.value); }
  else if (act === 'sound') { state.sound = e.target.value; applySound(); }
  else if (act === 'loop') { state.loop = e.target.checked; }
});
window.h3Player = {seekFrame: f => { sliderFrame = Number(f); if (!state.playing) seekFrame(f, false); }, play, pause,
                   state: () => ({playing: state.playing, time: now(),
                                  videos: videos().map(v => v ? v.currentTime : null)})};
""" % {"baseline": BASELINE_VIDEO_ID, "candidate": CANDIDATE_VIDEO_ID, "slider": FRAME_SLIDER_ID}  # noqa: UP031

# Runs in the browser before the frame slider's Python handler: seeks both videos to the slider's frame.
SEEK_ON_SLIDE_JS = ("(pair, frame, view) => { if (window.h3Player) window.h3Player.seekFrame(frame); "
                    "return [pair, frame, view]; }")
