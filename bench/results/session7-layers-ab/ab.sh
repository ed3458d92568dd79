#!/usr/bin/env bash
# Paired before/after of issue 18 (server in layers): 37c04b3 (before) and c3f97db (after).
cd /work/main
OUT=bench/results/session7-layers-ab
B=/work/wt/bench-bin
for i in 1 2 3; do
  for v in 37c04b3 c3f97db; do
    for sc in "fanout-max:fanout --subs 1000 --events 4000 --bytes 100" "fanout-200:fanout --subs 1000 --events 2000 --bytes 100 --rate 200" "idle-5000:idle --subs 5000 --one-channel"; do
      name=${sc%%:*}; args=${sc#*:}
      TARGETS=gapless GAPLESS_BIN=$B/gapless-$v GAPLESS_BENCH=$B/gapless-bench-c3f97db \
        OUT=$OUT/$v-$name-$i \
        bench/compare $args > $OUT/$v-$name-$i.txt 2>&1
      echo "$i $v $name rc=$?"
    done
  done
done
echo AB-DONE
