#!/usr/bin/env bash
# The device calls that trained the shipped h3-nano (TRAINING.md, run 3). Each stage is one call on a lent H200;
# a later stage resumes from the files the earlier one returned (copied here into out/run3/ and carried).
#   stage 1: text conditioning (word-level tokenizer + trained Qwen3-VL, in a second process) beside the video VAE
#            (continued from run 1 with the colour loss) and the audio VAE (from scratch), then the transformer.
#   stage 2: the transformer continues.            stage 3: turbo LoRAs (9 and 5 steps) and the live checks.
# Run 4 starts from run 3's shipped files (out/run4 = run 3's transformer, VAEs, log and text table):
#   stage 4: the video decoder alone learns sharper shapes (encoder frozen: the transformer's latents stay valid), in
#            a second process beside a new audio VAE (latent head against collapse) and the transformer continuing
#            on the new audio latents.
# Run 5 (TRAINING.md §5c) starts from run 4's transformer and run 3's video VAE (CK=out/run5in):
#   stage 5: the video latent widened 8 → 16 channels (train/widen.py) and the VAE trained on with the edge loss;
#            beside it an audio VAE in two steps (encoder and decoder with a latent head, a low encoder rate and a
#            DC penalty; then the decoder alone); then the widened transformer continues on the new latents.
#   stage 6: the transformer continues; beside it the audio decoder continues (the encoder, so the latents, fixed).
#   stage 7: the transformer, then new turbo LoRAs and the live checks; the audio decoder continues beside them.
#   stage 8: all of run 5 that one call holds, when the device time left allows only one: the audio VAE as in stage
#            5, run 4's transformer continuing on its latents (video VAE unchanged), new LoRAs and the checks; beside
#            them the widened video VAE alone, to measure its round trip for the next run.
# Run 6 starts from run 5's VAEs (CK=out/run9in: video_vae, audio_vae, train_log.json; no transformer):
#   stage 9: two processes, nothing else: the audio decoder alone (encoder fixed, so run 5's transformer keeps
#            working) with the relative-floor STFT and loudness losses; the video VAE widened to 16 channels, whose
#            round trip (tracker shape on 24 clips) decides whether the transformer is retrained on it.
# Issue 15's shape check, from the shipped model itself (no CK; MODEL, default assets/nano, is in the working tree):
#   stage 10: the video decoder alone (encoder frozen, so the shipped transformer's latents stay valid) from the
#            shipped VAE, with the silhouette loss (train/losses.py: the tracker's colour mask, softly) on top of the
#            weighted L1 and the colour loss, for SECS seconds (default 450); the round trip of 24 training clips
#            (tracker colour, motion, shape) is printed before and after. $OUT gets video_vae.safetensors (fp16,
#            the same keys as MODEL/vae/diffusion_pytorch_model.safetensors), train_log.json and stdout.log.
#            Needs only the .whl carried: CK, layouts and the text table are not used.
# Run 7 starts from the shipped nano itself (CK=out/run7in, rebuilt from assets/nano: the transformer, both VAEs, their
# latent statistics in train_log.json, and text.tar holding the engine's own caption table from train/text_embeds.py):
#   stage 11: the transformer continues on the shipped VAEs' latents (run 6's audio decoder, whose encoder run 5's
#            transformer saw for only 696 steps: the bounce clicks are not yet tied to the bounces), then new turbo
#            LoRAs and the live checks. One process; timeout keeps the call under its 600 s limit.
# Run 8 starts from the shipped nano too (CK=out/run7in):
#   stage 12: two processes. (a) the audio decoder alone (encoder fixed, so the transformer's audio latents stay
#            valid) with the click-band loss (--audio-click): run 6's decoder loses the bounce clicks that its
#            encoder's latent keeps (TRAINING.md 5h). (b) the video VAE widened to 16 channels and retrained, encoder
#            included, with the PCA readout loss (--vae-pca-readout: each latent cell must rebuild its block through
#            the top 16 PCA components, which keep 22/24 shapes), then the transformer (widened) continues on its
#            latents. Each prints its round trip before and after. Stage 13 continues from this output.
#   stage 13 (CK=out/run8in: stage 12's transformer, video VAE and log, with the shipped audio VAE and text.tar):
#            two processes: the transformer continues, then new turbo LoRAs and the live checks (stage 11's command);
#            beside it the video decoder alone (encoder frozen, so the transformer's latents stay valid) continues
#            from stage 12's VAE, which had 646 steps after its latent was remade.
# From here on CK is rebuilt from the shipped folder: python -m train.checkpoint_from_model --out out/ck (run 8's
# transformer and video VAE, run 6's audio VAE, their latent statistics, text.tar; --no-text for stages 14 and 15).
# Clicks for the shipped nano (TRAINING.md 5h), CK=out/ck:
#   stage 14: the audio decoder alone (encoder fixed, so the shipped transformer's audio latents stay valid) with the
#            click-band loss at weight 20 and half of each batch cropped around a bounce: on this CPU, 200 steps on
#            8 fixed crops taught it clicks within 10 ms of the bounces (in-sample). $OUT gets audio.tar.
# Shape, next (TRAINING.md 5h), CK=out/ck (run 8's 16-channel video VAE and its statistics):
#   stage 15: the video VAE alone, encoder included, with the PCA readout for a whole call (stage 12 gave it 646
#            steps), its round trip printed before and after. If the round trip passes run 6's 11/24 held-out shapes,
#            the transformer follows on its latents (stage 13 with CK = the new VAE and run 8's transformer).
#   stage 16: stages 14 and 15 side by side in one call (two processes; they share nothing), so one machine start
#            serves both. $OUT gets audio.tar and vae.tar.
# Run 9 (TRAINING.md 5i): stage 16 from CK=out/ck, then stage 13 with CK=out/run9in (run 8's transformer, stage 16's
# video VAE and its latent statistics, stage 16's audio decoder, text.tar), then:
#   stage 17 (CK = stage 13's video_vae13.safetensors as video_vae.safetensors, with v13_train_log.json as
#            train_log.json): the video decoder alone continues (encoder frozen), for the device time that was left.
# Issue 21, the nano trained for each task. CK=out/ck built WITH tasks.pt (python -m train.checkpoint_from_model --out
# out/ck --tasks, about 2 min on CPU: the shipped weights, text.tar and 1,200 fl2va + 400 ref2va samples of
# train/tasks.py; 37 MB, so with .whl and data/layouts.pt.gz the carry is 44 MB):
#   stage 18: the shipped transformer fine-tuned for fl2va and ref2va, one process. Each batch of 64 is 19 fl2va
#            samples (the clip's own first frame as the keyframe; a quarter first and last, a tenth the last alone), 6
#            ref2va (a rendered 352x352 reference of the clip's subject) and 39 t2va (so t2va is kept), all on the
#            engine's packed layouts: keyframe/reference rows (VAE-encoded on the device, as the engine's encode_inputs
#            does) ahead of the target rows, held at t = max(t, 0.999), the loss on the generated rows only; the prompt
#            embeddings with the image's vision-tower rows come from tasks.pt (encoded by the engine on CPU: the
#            device's transformers differs). A quarter of the task prompts name neither colour nor shape. Clips: the
#            1,600 task clips plus 400 more for t2va. No LoRAs (the shipped turbo LoRAs stay; re-check them on CPU),
#            then the t2va live check (20 held-out prompts). $OUT gets transformer.safetensors, the two carried VAEs
#            (unchanged, so the folder exports as is), train_log.json (per-task losses under dit.task_losses) and
#            stdout.log. CPU after: python -m train.export_nano OUT_COPY /tmp/nano18, then python -m train.verify_nano
#            --model /tmp/nano18 --checks fl2va,steering --prompts 5 (fl2va against its t2va control).
#   stage 19: stage 13 with stage 18's task mix: after a VAE change (stage 15) the transformer continues on the new
#            latents and learns fl2va/ref2va in the same call, then new turbo LoRAs and the live checks; beside it the
#            video decoder alone. CK as for stage 13 plus tasks.pt (checkpoint_from_model --tasks; its prompt
#            embeddings depend on the text encoder only, so a tasks.pt built from assets/nano serves a new VAE).
#            1,600 t2va clips beside the 1,600 task clips: 3,200 in all, which stage 13 encoded in 88 s.
# Run 10 (TRAINING.md 5j), two calls back to back on one warm machine. The weights come from the tracked model folder
# (MODEL, default assets/nano: CK with weights, text.tar and tasks.pt would overrun the 64 MiB a call carries), so CK
# holds only text.tar and tasks.pt (out/ckl):
#   stage 20: stage 15 (the video VAE, encoder included, with the readout) beside stage 18 (the shipped transformer
#            fine-tuned for fl2va/ref2va on the shipped latents). Both results also stay on the device in out/warm/.
#   stage 21: stage 19 from stage 20's results in out/warm/ (the call must find the machine still warm): the stage-18
#            transformer continues with the task mix, then new LoRAs, beside the video decoder alone. Stage 15's VAE
#            replaces the shipped one only if its round trip (tracker shape on 24 training + 24 held-out clips)
#            reaches ADOPT_AT of 48 (default 29; the shipped VAE: 25); otherwise the latents stay as shipped.
#   stage 22: stage 19 from the tracked model folder alone (after run 10 shipped): the shipped transformer continues
#            with the task mix on the shipped latents, new LoRAs, the decoder alone beside it; CK = out/ckl as above.
#            Extra flags reach train_nano: `bash train/gpu_run.sh 22 --subject-weight 4` weighs the video rows that hold
#            the shape 4x in the flow loss (TRAINING.md 5j: squares and triangles come out as blobs).
#   stage 23: stage 22's transformer continuation twice, side by side on the one GPU: plain, and with
#            --subject-weight ${SUBJECT_WEIGHT:-4}; no decoder. Each gets about half the steps stage 22 would, and the
#            pair says whether the weighting moves the shape. $OUT: transformer_{plain,subject}.safetensors, and
#            rest_{plain,subject}.tar (LoRAs, train_log.json, stdout.log). CPU after, per variant V:
#            python -m train.checkpoint_from_model --out /tmp/V --no-text; tar xf rest_V.tar -C /tmp/V;
#            cp transformer_V.safetensors /tmp/V/transformer.safetensors; python -m train.export_nano /tmp/V
#            /tmp/nanoV --loras /tmp/lorasV; python -m train.verify_nano --model /tmp/nanoV --loras /tmp/lorasV
#            --checks steering --prompts 40.
# Usage (device): bash train/gpu_run.sh STAGE [extra train_nano flags]; carry .whl, data/layouts.pt.gz and CK (default
# out/run3; out/run4 for stage 4; the folder the previous stage returned, with text.tar and the newest audio decoder as audio_vae.safetensors, for 6 and 7).
set -euo pipefail
stage=$1; shift
[ "$stage" = 10 ] || [ -f data/nano_train/layouts.pt ] || { mkdir -p data/nano_train; gunzip -c data/layouts.pt.gz > data/nano_train/layouts.pt; }
[ -d /tmp/site/diffusers ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
: "${OUT:?OUT must name the folder that comes back}"
TABLE=/tmp/text/caption_embeds.pt
common=(--out "$OUT" --mirror /tmp/ck --text-table "$TABLE" --dit-batch 64 --num-clips 3200 --check-prompts 20)
CK=${CK:-out/run3}
if [ "$stage" != 1 ] && [ "$stage" != 9 ] && [ "$stage" != 10 ] && [ "$stage" != 14 ] && [ "$stage" != 15 ] && [ "$stage" != 16 ] && [ "$stage" != 17 ] \
   && [ "$stage" != 20 ] && [ "$stage" != 21 ] && [ "$stage" != 22 ] && [ "$stage" != 23 ]; then
  [ -f "$TABLE" ] || tar xf "$CK/text.tar" -C /tmp
  [ -f /tmp/ck/transformer.safetensors ] || { mkdir -p /tmp/ck; cp "$CK"/*.safetensors "$CK/train_log.json" /tmp/ck/; }
fi
# CK of stages 20-22 in folder $1: the weights of the tracked model folder, text.tar and tasks.pt from the carried CK.
# /tmp/ck and /tmp/text (a warm machine's copies from an earlier call) go, so the next stage copies this CK.
tracked_ck() {
  rm -rf "$1" /tmp/ck /tmp/text
  python3 -m train.checkpoint_from_model --model "${MODEL:-assets/nano}" --out "$1" --no-text
  cp "$CK/text.tar" "$CK/tasks.pt" "$1/"
}
# The transformer continues, then new turbo LoRAs and the live checks, inside one call: continue_dit LR BUDGET [flags]
continue_dit() {
  timeout 585 python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit,lora --audio-weight 1.0 \
    --dit-lr "$1" --dit-seconds 600 --reserve-after-dit 215 --lora-seconds 70 --reserve-final 50 --check-seconds 45 \
    --budget "$2" "${@:3}" 2>&1 | tee "$OUT/stdout.log"
}
case $stage in
  1)
    ( python3 -m train.text_conditioning --out /tmp/text --table "$TABLE" --seconds 150 \
      && tar cf "$OUT/text.tar" -C /tmp text ) > "$OUT/text.log" 2>&1 &
    python3 -m train.train_nano "${common[@]}" --resume train/checkpoints/run1 --continue-phases video_vae \
      --phases video_vae,audio_vae,dit --wait-text-table 300 --budget 545 \
      --vae-seconds 170 --reserve-after-vae 330 --audio-seconds 50 --reserve-after-audio 280 \
      --dit-seconds 600 --reserve-after-dit 35 "$@" 2>&1 | tee "$OUT/stdout.log"
    wait ;;
  2)
    python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit --budget 550 \
      --dit-seconds 600 --reserve-after-dit 35 "$@" 2>&1 | tee "$OUT/stdout.log"
    tar cf "$OUT/text.tar" -C /tmp text ;;
  3)
    python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases lora --budget 300 \
      --lora-seconds 90 --reserve-final 50 --check-seconds 45 "$@" 2>&1 | tee "$OUT/stdout.log"
    tar cf "$OUT/text.tar" -C /tmp text ;;
  4)
    mkdir -p "$OUT/vae"
    python3 -m train.train_nano --out "$OUT/vae" --resume "$CK" --continue-phases video_vae --phases video_vae \
      --vae-decoder-only --edge-weight 8 --vae-batch 24 --vae-lr 1e-3 --vae-seconds 470 --budget 520 \
      --reserve-after-vae 20 > "$OUT/vae/stdout.log" 2>&1 &
    python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases audio_vae,dit --budget 545 \
      --audio-probe 1 --audio-l1 0.1 --audio-kl-after 500 --audio-batch 32 --audio-seconds 150 \
      --reserve-after-audio 340 --audio-weight 1.0 --dit-lr 4e-4 --dit-seconds 600 --reserve-after-dit 30 "$@" \
      2>&1 | tee "$OUT/stdout.log"
    wait
    rm -f "$OUT/video_vae.safetensors"  # the carried (frozen-encoder) copy; the fine-tuned one is in $OUT/vae
    cp "$OUT/vae/video_vae.safetensors" /tmp/ck/ 2>/dev/null || true ;;
  5)
    audio=(--phases audio_vae --audio-batch 32 --audio-lr 2e-3 --audio-l1 0.1 --audio-deterministic --reserve-after-audio 0)
    ( python3 -m train.train_nano --out /tmp/a1 "${audio[@]}" --audio-enc-lr 1e-4 --audio-probe 4 --audio-dc 1 \
        --audio-kl-after 1000000000 --audio-seconds 150 --budget 155 > /tmp/a1.log 2>&1
      python3 -m train.train_nano --out /tmp/a2 --resume /tmp/a1 --continue-phases audio_vae "${audio[@]}" \
        --audio-decoder-only --audio-seconds 290 --budget 295 > /tmp/a2.log 2>&1 ) &
    python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --continue-phases video_vae --phases video_vae,dit \
      --video-latent-channels 16 --edge-weight 8 --vae-batch 24 --vae-lr 1e-3 --vae-seconds 250 --reserve-after-vae 180 \
      --audio-from /tmp/a1 --wait-audio 150 --audio-weight 1.0 --dit-lr 5e-4 --dit-seconds 600 --reserve-after-dit 30 \
      --budget 460 "$@" 2>&1 | tee "$OUT/stdout.log"
    wait
    rm -f "$OUT/preview.npz"
    tar cf "$OUT/audio.tar" -C /tmp a1 a2 a1.log a2.log ;;
  6|7)
    # The audio decoder continues from the newest checkpoint here (a warm machine) or the carried one.
    from=$(ls -d /tmp/a[0-9] 2>/dev/null | sort | tail -1); from=${from:-$CK}  # its audio_vae.safetensors: the newest decoder (same encoder)
    next=/tmp/a$stage; seconds=$([ "$stage" = 6 ] && echo 530 || echo 425)
    python3 -m train.train_nano --out "$next" --resume "$from" --continue-phases audio_vae --phases audio_vae \
      --audio-decoder-only --audio-batch 32 --audio-lr 1e-3 --audio-l1 0.1 --audio-deterministic \
      --reserve-after-audio 0 --audio-seconds "$seconds" --budget "$((seconds + 5))" > "$next.log" 2>&1 &
    if [ "$stage" = 6 ]; then
      python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit --audio-weight 1.0 --dit-lr 4e-4 \
        --dit-seconds 600 --reserve-after-dit 30 --budget 550 "$@" 2>&1 | tee "$OUT/stdout.log"
    else
      python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit,lora --audio-weight 1.0 --dit-lr 4e-4 \
        --dit-seconds 600 --reserve-after-dit 205 --lora-seconds 70 --reserve-final 50 --check-seconds 45 \
        --budget 440 "$@" 2>&1 | tee "$OUT/stdout.log"
    fi
    wait
    rm -f "$OUT/preview.npz"
    tar cf "$OUT/audio.tar" -C /tmp "a$stage" "a$stage.log" ;;
  8)
    audio=(--phases audio_vae --audio-batch 32 --audio-lr 2e-3 --audio-l1 0.1 --audio-deterministic --reserve-after-audio 0)
    ( python3 -m train.train_nano --out /tmp/a1 "${audio[@]}" --audio-enc-lr 1e-4 --audio-probe 4 --audio-dc 1 \
        --audio-kl-after 1000000000 --audio-seconds 140 --budget 145 > /tmp/a1.log 2>&1
      python3 -m train.train_nano --out /tmp/a2 --resume /tmp/a1 --continue-phases audio_vae "${audio[@]}" \
        --audio-decoder-only --audio-seconds 390 --budget 395 > /tmp/a2.log 2>&1 ) &
    python3 -m train.train_nano --out /tmp/v5 --resume "$CK" --continue-phases video_vae --phases video_vae \
      --video-latent-channels 16 --edge-weight 8 --vae-batch 24 --vae-lr 1e-3 --vae-seconds 300 --budget 330 \
      --reserve-after-vae 0 > /tmp/v5.log 2>&1 &
    python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit,lora --audio-from /tmp/a1 \
      --wait-audio 200 --audio-weight 1.0 --dit-lr 4e-4 --dit-seconds 600 --reserve-after-dit 170 \
      --lora-seconds 55 --reserve-final 45 --check-seconds 40 --budget 545 "$@" 2>&1 | tee "$OUT/stdout.log"
    wait
    rm -f "$OUT/preview.npz" "$OUT/video_vae.safetensors"  # the video VAE is the carried one, unchanged
    tar cf "$OUT/audio.tar" -C /tmp a1 a2 a1.log a2.log
    tar cf "$OUT/vae.tar" -C /tmp v5 v5.log ;;
  9)
    # Each process stops itself at its budget; timeout is the backstop that keeps the call under its 600 s limit.
    timeout 470 python3 -m train.train_nano --out /tmp/a9 --resume "$CK" --continue-phases audio_vae \
      --phases audio_vae --audio-decoder-only --audio-batch 32 --audio-lr 1e-3 --audio-l1 0.1 --audio-deterministic \
      --audio-stft-floor 0.01 --audio-loudness 0.5 --reserve-after-audio 0 --audio-seconds 420 --budget 430 \
      > /tmp/a9.log 2>&1 &
    timeout 470 python3 -m train.train_nano --out /tmp/v9 --resume "$CK" --continue-phases video_vae \
      --phases video_vae --video-latent-channels 16 --edge-weight 8 --vae-batch 24 --vae-lr 1e-3 \
      --vae-seconds 400 --reserve-after-vae 0 --budget 430 "$@" > /tmp/v9.log 2>&1 &
    while pgrep -f "train.train_nano" > /dev/null; do sleep 30; tail -qn1 /tmp/a9.log /tmp/v9.log; done
    tar cf "$OUT/audio.tar" -C /tmp a9 a9.log
    tar cf "$OUT/vae.tar" -C /tmp v9 v9.log ;;
  13)
    timeout 520 python3 -m train.train_nano --out /tmp/v13 --resume "$CK" --continue-phases video_vae \
      --phases video_vae --vae-decoder-only --edge-weight 8 --vae-batch 24 --vae-lr 5e-4 --vae-seconds 430 \
      --reserve-after-vae 0 --budget 500 > /tmp/v13.log 2>&1 &
    continue_dit 4e-4 520 "$@"
    wait
    # $OUT brings back 8 files: drop the carried VAEs (unchanged copies) so the continued decoder fits
    rm -f "$OUT/preview.npz" "$OUT/video_vae.safetensors" "$OUT/audio_vae.safetensors"
    cp /tmp/v13/video_vae.safetensors "$OUT/video_vae13.safetensors"
    cp /tmp/v13.log "$OUT/v13.log"; cp /tmp/v13/train_log.json "$OUT/v13_train_log.json" ;;
  11)
    continue_dit 3e-4 510 "$@"
    rm -f "$OUT/preview.npz" ;;
  12)
    timeout 500 python3 -m train.train_nano --out /tmp/a12 --resume "$CK" --continue-phases audio_vae \
      --phases audio_vae --audio-decoder-only --audio-batch 32 --audio-lr 1e-3 --audio-l1 0.1 --audio-deterministic \
      --audio-stft-floor 0.01 --audio-loudness 0.5 --audio-click 2 --roundtrip-before --reserve-after-audio 0 \
      --audio-seconds 430 --budget 450 > /tmp/a12.log 2>&1 &
    timeout 560 python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --vae-from-model "${MODEL:-assets/nano}" \
      --phases video_vae,dit --video-latent-channels 16 --vae-pca-readout 10 --edge-weight 8 --vae-batch 24 \
      --vae-lr 1e-3 --roundtrip-before --vae-seconds 300 --reserve-after-vae 200 --dit-lr 5e-4 --dit-seconds 600 \
      --reserve-after-dit 30 --audio-weight 1.0 --budget 530 "$@" 2>&1 | tee "$OUT/stdout.log"
    wait
    rm -f "$OUT/preview.npz"
    cp /tmp/a12/audio_vae.safetensors "$OUT/"  # the new decoder (its encoder, so the latents, unchanged)
    cp /tmp/a12.log "$OUT/a12.log"; cp /tmp/a12/train_log.json "$OUT/a12_train_log.json" ;;
  14)
    timeout 540 python3 -m train.train_nano --out /tmp/a14 --resume "$CK" --continue-phases audio_vae \
      --phases audio_vae --audio-decoder-only --audio-batch 32 --audio-lr 2e-3 --audio-l1 0.1 --audio-deterministic \
      --audio-stft-floor 0.01 --audio-loudness 0.5 --audio-click 20 --audio-bounce-share 0.5 --roundtrip-before \
      --reserve-after-audio 0 --audio-seconds 480 --budget 500 "$@" 2>&1 | tee /tmp/a14.log
    tar cf "$OUT/audio.tar" -C /tmp a14 a14.log ;;
  15)
    timeout 560 python3 -m train.train_nano --out "$OUT" --resume "$CK" --continue-phases video_vae --phases video_vae \
      --vae-pca-readout 10 --edge-weight 8 --vae-batch 24 --vae-lr 5e-4 --roundtrip-before --vae-seconds 400 \
      --reserve-after-vae 0 --budget 540 "$@" 2>&1 | tee "$OUT/stdout.log" ;;
  16)
    mkdir -p /tmp/o14 /tmp/o15
    OUT=/tmp/o14 bash "$0" 14 > /tmp/s14.log 2>&1 &
    OUT=/tmp/o15 bash "$0" 15 "$@" > /tmp/s15.log 2>&1 &
    while [ "$(jobs -r | wc -l)" -gt 0 ]; do
      sleep 30; tail -qn1 /tmp/s14.log /tmp/s15.log
    done
    wait
    cp /tmp/o14/audio.tar "$OUT/"
    rm -f /tmp/o15/preview.npz; tar cf "$OUT/vae.tar" -C /tmp o15 ;;
  17)
    timeout 440 python3 -m train.train_nano --out "$OUT" --resume "$CK" --continue-phases video_vae --phases video_vae \
      --vae-decoder-only --edge-weight 8 --vae-batch 24 --vae-lr 5e-4 --vae-seconds 330 --reserve-after-vae 0 \
      --budget 420 "$@" > "$OUT/v17.log" 2>&1
    rm -f "$OUT/preview.npz" ;;
  18)
    # The conditioned samples need diffusers' modular blocks and the engine: fail before any time is spent.
    python3 -c "import engine.tasks, train.tasks, diffusers.modular_pipelines.minimax_h3.encoders" || exit 1
    [ -f "$CK/tasks.pt" ] || { echo "no $CK/tasks.pt: checkpoint_from_model --tasks builds it"; exit 1; }
    timeout 570 python3 -m train.train_nano "${common[@]}" --resume /tmp/ck --phases dit --num-clips 400 \
      --task-mix fl2va=0.3,ref2va=0.1 --task-table "$CK/tasks.pt" --audio-weight 1.0 --dit-lr 3e-4 \
      --dit-seconds 600 --reserve-after-dit 40 --budget 540 "$@" 2>&1 | tee "$OUT/stdout.log"
    rm -f "$OUT/preview.npz" ;;
  19)
    python3 -c "import engine.tasks, train.tasks, diffusers.modular_pipelines.minimax_h3.encoders" || exit 1
    [ -f "$CK/tasks.pt" ] || { echo "no $CK/tasks.pt: checkpoint_from_model --tasks builds it"; exit 1; }
    bash "$0" 13 --task-mix fl2va=0.3,ref2va=0.1 --task-table "$CK/tasks.pt" --num-clips 1600 "$@" ;;
  20)
    base=/tmp/ck20; tracked_ck "$base"
    mkdir -p /tmp/o15 /tmp/o18
    CK=$base OUT=/tmp/o15 bash "$0" 15 --budget 490 --vae-seconds 380 > /tmp/s15.log 2>&1 &
    CK=$base OUT=/tmp/o18 bash "$0" 18 --budget 510 "$@" > /tmp/s18.log 2>&1 &
    while [ "$(jobs -r | wc -l)" -gt 0 ]; do
      sleep 30; tail -qn1 /tmp/s15.log /tmp/s18.log
    done
    wait
    grep -h -i -E "roundtrip|round trip|check|followed" /tmp/s15.log /tmp/s18.log | tail -20
    rm -f /tmp/o15/preview.npz /tmp/o18/preview.npz
    mkdir -p out/warm; rm -rf out/warm/v15 out/warm/t18; cp -r /tmp/o15 out/warm/v15; cp -r /tmp/o18 out/warm/t18
    cp /tmp/o18/transformer.safetensors /tmp/o18/train_log.json /tmp/o18/stdout.log "$OUT/"
    cp /tmp/s15.log "$OUT/"; tar cf "$OUT/vae.tar" -C /tmp o15 ;;
  22)
    base=/tmp/ck22; tracked_ck "$base"
    CK=$base bash "$0" 19 "$@" ;;
  23)
    base=/tmp/ck23; tracked_ck "$base"
    tar xf "$base/text.tar" -C /tmp
    variant() {  # NAME [flags]: stage 19's transformer continuation (task mix, LoRAs, checks) in its own folders
      rm -rf "/tmp/ck_$1" "/tmp/o_$1"; mkdir -p "/tmp/ck_$1" "/tmp/o_$1"
      cp "$base"/*.safetensors "$base/train_log.json" "/tmp/ck_$1/"
      timeout 585 python3 -m train.train_nano --out "/tmp/o_$1" --mirror "/tmp/ck_$1" --text-table "$TABLE" \
        --dit-batch 64 --num-clips 1600 --check-prompts 20 --resume "/tmp/ck_$1" --phases dit,lora --audio-weight 1.0 \
        --dit-lr 4e-4 --dit-seconds 600 --reserve-after-dit 215 --lora-seconds 70 --reserve-final 50 \
        --check-seconds 45 --budget 560 --task-mix fl2va=0.3,ref2va=0.1 --task-table "$base/tasks.pt" "${@:2}" \
        > "/tmp/o_$1/stdout.log" 2>&1
    }
    variant plain "$@" &
    variant subject --subject-weight "${SUBJECT_WEIGHT:-4}" "$@" &
    while [ "$(jobs -r | wc -l)" -gt 0 ]; do
      sleep 30; tail -qn1 /tmp/o_plain/stdout.log /tmp/o_subject/stdout.log
    done
    wait
    for v in plain subject; do
      grep -h -i -E "steps=|check|followed" "/tmp/o_$v/stdout.log" | tail -6
      cp "/tmp/o_$v/transformer.safetensors" "$OUT/transformer_$v.safetensors"
      tar cf "$OUT/rest_$v.tar" -C "/tmp/o_$v" $(cd "/tmp/o_$v" && ls lora*.safetensors train_log.json stdout.log 2>/dev/null)
    done ;;
  21)
    [ -f out/warm/t18/transformer.safetensors ] || { echo "no out/warm/t18: this machine did not run stage 20"; exit 3; }
    base=/tmp/ck21; tracked_ck "$base"
    cp out/warm/t18/transformer.safetensors "$base/"
    ADOPT_AT=${ADOPT_AT:-29} python3 - "$base" <<'PY'
import json, os, shutil, sys
base, new = sys.argv[1], "out/warm/v15"
vae = json.load(open(f"{new}/train_log.json"))["phases"]["video_vae"]
shape = sum(int(vae["roundtrip"][split]["shape"].split("/")[0]) for split in ("train", "heldout"))
adopt = shape >= int(os.environ["ADOPT_AT"])
print(f"stage 15's VAE: shape {shape}/48 in its round trip; adopted: {adopt}", flush=True)
if adopt:
    shutil.copyfile(f"{new}/video_vae.safetensors", f"{base}/video_vae.safetensors")
    log = json.load(open(f"{base}/train_log.json"))
    log["phases"]["video_vae"] = {k: vae[k] for k in ("latents_mean", "latents_std")}
    json.dump(log, open(f"{base}/train_log.json", "w"), indent=1)
PY
    CK=$base bash "$0" 19 "$@" ;;
  10)
    secs=${SECS:-450}
    timeout $((secs + 100)) python3 -m train.train_nano --out "$OUT" --mirror /tmp/ck10 \
      --vae-from-model "${MODEL:-assets/nano}" --phases video_vae --vae-decoder-only --roundtrip-before \
      --silhouette-weight 1 --vae-batch 24 --vae-lr 5e-4 --vae-seconds "$secs" --budget $((secs + 90)) \
      --reserve-after-vae 0 --vae-log-every 25 "$@" 2>&1 | tee "$OUT/stdout.log" ;;
esac
