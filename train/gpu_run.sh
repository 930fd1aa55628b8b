#!/usr/bin/env bash
# The device calls that trained the shipped h3-nano (TRAINING.md, run 3). Each stage is one call on a lent H200;
# a later stage resumes from the files the earlier one returned (copied here into out/run3/ and carried).
#   stage 1: text conditioning (word-level tokenizer + trained Qwen3-VL, in a second process) beside the video VAE
#            (continued from run 1 with the colour loss) and the audio VAE (from scratch), then the transformer.
#   stage 2: the transformer continues.            stage 3: turbo LoRAs (9 and 5 steps) and the live checks.
# Usage (device): bash train/gpu_run.sh STAGE [extra train_nano flags]; carry .whl, data/nano_train, out/run3.
set -euo pipefail
stage=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
: "${OUT:?OUT must name the folder that comes back}"
TABLE=/tmp/text/caption_embeds.pt
common=(--out "$OUT" --mirror /tmp/ck --text-table "$TABLE" --dit-batch 64 --num-clips 3200 --check-prompts 20)
if [ "$stage" != 1 ]; then
  [ -f "$TABLE" ] || tar xf out/run3/text.tar -C /tmp
  [ -f /tmp/ck/transformer.safetensors ] || { mkdir -p /tmp/ck; cp out/run3/*.safetensors out/run3/train_log.json /tmp/ck/; }
fi
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
esac
