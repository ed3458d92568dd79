#!/usr/bin/env bash
# Paired: c3f97db (after issue 18, before binary payloads) and HEAD (binary payloads, Durable Streams).
cd /work/main
OUT=bench/results/session7-payload-ab
mkdir -p $OUT
B=/work/wt/bench-bin
for i in 1 2; do
  for v in c3f97db head; do
    for sc in "fanout-max:fanout --subs 1000 --events 4000 --bytes 100" "idle-5000:idle --subs 5000 --one-channel"; do
      name=${sc%%:*}; args=${sc#*:}
      TARGETS=gapless GAPLESS_BIN=$B/gapless-$v GAPLESS_BENCH=$B/gapless-bench-c3f97db \
        OUT=$OUT/$v-$name-$i bench/compare $args > $OUT/$v-$name-$i.txt 2>&1
      echo "$i $v $name rc=$?"
    done
  done
done
for n in fanout-max idle-5000; do for v in c3f97db head; do cat $OUT/$v-$n-*/gapless.jsonl > $OUT/$v-$n.jsonl; done
  $B/gapless-bench-c3f97db compare $OUT/c3f97db-$n.jsonl $OUT/head-$n.jsonl > $OUT/compare-$n.md 2>&1; done
find $OUT -name gapless-server.log -delete
echo AB-DONE
