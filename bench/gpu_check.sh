#!/usr/bin/env bash
# On the GPU machine, from the repository root, after bench/gpu_stage.sh: the CUDA tests, the
# sanitizers, a per-kernel profile (B=1 T=65536 unless $GDN_PROFILE_SHAPES says), then bench_cuda
# and bench/peers.py's speed part (gdn, FLA, FlashQLA and transformers in the same run). Logs go
# to $OUT (or ./gpu-logs).
# Stages: test, cp, cp-bench, cp-sanitize, profile, stalls, lines, bench, ab, variants, accuracy,
# peers-profile (default: test sanitize profile bench). stalls and lines profile one training
# forward + backward (`gdn run`) at T=$GDN_PROFILE_T (16384), the kernels matching
# $GDN_PROFILE_KERNELS, skipping the first $GDN_PROFILE_SKIP of them (0) and profiling
# $GDN_PROFILE_COUNT (7): e.g. the forward's output pass at T=65536 is GDN_PROFILE_T=65536
# GDN_PROFILE_KERNELS=state_forward GDN_PROFILE_SKIP=1 GDN_PROFILE_COUNT=1 (at T=16384 the
# training forward runs the save pass instead).
set -uo pipefail
# gpu_stage.sh packs .device/ into .device.txz, which a device call carries alone: unpacked here.
[ -f .device.txz ] && [ ! -d .device ] && tar -xJf .device.txz
out="${OUT:-$PWD/gpu-logs}"
mkdir -p "$out"
profile_t="${GDN_PROFILE_T:-16384}"
profile_kernels="${GDN_PROFILE_KERNELS:-chunk_prep|state_|grad_chunk}"
profile_range=(-k "regex:$profile_kernels" --launch-skip "${GDN_PROFILE_SKIP:-0}" -c "${GDN_PROFILE_COUNT:-7}")
stages="${*:-test sanitize profile bench}"
export LD_LIBRARY_PATH="$PWD/.device${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for stage in $stages; do
  case "$stage" in
    test)
      .device/test_cuda_l2norm 2>&1 | tail -1
      .device/test_cuda_wgmma 2>&1 | grep -E "OK|FAILED|Failure|first value|PASSED"
      .device/test_cuda_delta_rule >"$out/test.log" 2>&1
      grep -E "errors|FAILED|Failure|PASSED" "$out/test.log" | tail -30
      for t in test_cuda_determinism test_cuda_guards; do
        .device/$t >"$out/$t.log" 2>&1
        grep -E "FAILED|Failure|PASSED" "$out/$t.log" | tail -12
      done ;;
    cp)  # context parallelism on virtual ranks, the device communicators, the CLI lines
      .device/test_comm_gpu 2>&1 | grep -E "OK|FAILED|PASSED"
      [ -x .device/test_comm_nccl ] && .device/test_comm_nccl 2>&1 | grep -E "OK \]|SKIPPED \]|FAILED|PASSED"
      .device/test_cuda_cp >"$out/cp.log" 2>&1
      grep -E "^\[ cp|FAILED|PASSED" "$out/cp.log" | sed -E 's/ \(error vs.*from 1 GPU\)//' | tail -80
      .device/gdn run --device cuda -T 16384 --ranks 4 --strategy all 2>&1 | tail -24 | tee "$out/run.log"
      python3 bench/make_op_input.py write "$out/in.st" 8192 --varlen
      .device/gdn op "$out/in.st" "$out/one.st" --l2norm --device cuda
      for s in relay scan ulysses; do
        .device/gdn op "$out/in.st" "$out/cp.st" --l2norm --device cuda --ranks 4 --strategy $s &&
          echo "gdn op --ranks 4 --strategy $s against one GPU:" &&
          python3 bench/make_op_input.py compare "$out/cp.st" "$out/one.st" | tail -1
      done
      rm -f "$out"/*.st ;;
    cp-bench)  # a rank's stages against the single-GPU op (the cost model's GPU constants)
      .device/bench_cuda_cp | tee "$out/cp-bench.log" ;;
    cp-sanitize)
      timeout 250 compute-sanitizer --tool memcheck .device/test_cuda_cp \
        --gtest_filter='*/varlen_*_P4:*/T3000_relay_P3:*/B2_scan_P4' 2>&1 |
        tee "$out/cp-memcheck.log" | grep -E "ERROR SUMMARY|PASSED|FAILED"
      timeout 250 compute-sanitizer --tool racecheck .device/test_cuda_cp \
        --gtest_filter='*/varlen_scan_P2:*/T3072_summary_allgather_P3' 2>&1 |
        tee "$out/cp-racecheck.log" | grep -E "RACECHECK SUMMARY|PASSED|FAILED" ;;
    sanitize)
      timeout 200 compute-sanitizer --tool memcheck .device/test_cuda_delta_rule \
        --gtest_filter='*Varlen*:*GroupedHeads/4*:*F16*:*Reuses*' 2>&1 | tee "$out/memcheck.log" |
        grep -E "ERROR SUMMARY|PASSED|FAILED"
      timeout 200 compute-sanitizer --tool racecheck .device/test_cuda_delta_rule \
        --gtest_filter='*GroupedHeads/4*' 2>&1 | tee "$out/racecheck.log" |
        grep -E "RACECHECK SUMMARY|PASSED|FAILED" ;;
    profile)  # each kernel's time in one training step (`gdn run`) of each shape in
      # $GDN_PROFILE_SHAPES (';' between them; default -T 65536)
      IFS=';' read -ra shapes <<<"${GDN_PROFILE_SHAPES:--T 65536}"
      for i in "${!shapes[@]}"; do
        echo "== gdn run ${shapes[$i]}"
        # shellcheck disable=SC2086  # a shape is several arguments
        ncu --clock-control none --metrics gpu__time_duration.sum .device/gdn run --device cuda \
          ${shapes[$i]} --ranks 1 >"$out/ncu-$i.log" 2>&1
        grep -E "^  [a-zA-Z_ <>:,0-9]+\(|gpu__time_duration" "$out/ncu-$i.log" |
          sed -E 's/^ *(void )?//; s/\(Params.*//; s/gpu__time_duration.sum//' | paste - -
      done ;;
    stalls)  # why each kernel waits (cycles per issued instruction by stall reason)
      ncu --clock-control none --section WarpStateStats --section SchedulerStats --print-details all \
        "${profile_range[@]}" .device/gdn run --device cuda -T "$profile_t" \
        --ranks 1 >"$out/stalls.log" 2>&1
      grep -E "^  [a-zA-Z_ <>:,0-9]+\(|Issued Ipc|No Eligible|Stall [A-Z]" "$out/stalls.log" |
        grep -vE " 0(\.0+)?$" | sed -E 's/^ *(void )?//; s/\(Params.*//' ;;
    lines)  # where each kernel issues and stalls, per source line (bench/ncu_lines.py)
      ncu --clock-control none --section SourceCounters --section WarpStateStats --import-source yes \
        "${profile_range[@]}" -f -o "$out/lines" .device/gdn run --device cuda \
        -T "$profile_t" --ranks 1 >"$out/lines-run.log" 2>&1
      python3 bench/ncu_lines.py "$out/lines.ncu-rep" "" 20 | tee "$out/lines.txt" | grep -E "^==|^--"
      rm -f "$out/lines.ncu-rep" ;;
    bench)  # gdn and its peers by CUDA-graph replay (bench/gpu_peers.sh installs the wheels); all
      # four peers take a whole call on a fresh machine (FLA's autotune alone about 260 s)
      .device/bench_cuda | tee "$out/bench.log"
      bash bench/gpu_peers.sh --part speed ;;
    ab)  # this build's bench_cuda against .device/base/'s (gpu_stage.sh --base) and any variants
      # (--variant, --patch), in turns, two rounds; GDN_AB_ROWS: bench_cuda argument lists, ';'
      # between rows; GDN_AB_PROGRAMS: which, in order (new: this build; others: .device/NAME/);
      # GDN_AB_TIMEOUT: seconds a run (120), so that a variant that hangs costs only that
      rows="${GDN_AB_ROWS:-1 65536 16 32;1 16384 16 32;1 4096 16 32;8 8192 16 32;1 65536 1 2}"
      programs="${GDN_AB_PROGRAMS:-base new}"
      echo "ms fwd / fwd+bwd, GiB; new: this build"
      for name in $programs; do
        [ -f ".device/$name/flags" ] && echo "$name: this tree with $(cat ".device/$name/flags")"
        [ -f ".device/$name/commit" ] && echo "$name: commit $(cat ".device/$name/commit")"
      done
      for round in 1 2; do
        for which in $programs; do
          program=.device/bench_cuda
          [ "$which" != new ] && program=".device/$which/bench_cuda"
          IFS=';' read -ra list <<<"$rows"
          for row in "${list[@]}"; do
            # shellcheck disable=SC2086  # a row is several arguments
            echo "$which $round: $(timeout "${GDN_AB_TIMEOUT:-120}" $program $row 2>&1 |
              grep -E "gdn-cuda|bench_cuda:" |
              sed -E 's/ \(([0-9.]+) TFLOP[^,]*, /(/g; s/ \| inputs.*//; s/workspaces? //g')"
          done
        done
      done | tee "$out/ab.log"
      python3 bench/ab_table.py "$out/ab.log" "${programs%% *}" ;;
    variants)  # the test programs staged beside each variant (gpu_stage.sh GDN_VARIANT_TESTS),
      # each under a timeout (a protocol bug hangs): GDN_TEST_PROGRAMS lists NAME or
      # NAME=GTEST_FILTER (new: this build's test_cuda_delta_rule; others: .device/NAME/ or
      # build-stage2/NAME/, a second carry; NAME may be a path such as bisect/v2),
      # GDN_TEST_TIMEOUT seconds each (400: test_cuda_delta_rule took 167-186 s on one H100 of the
      # forty-first session and more than 200 on another, its float64 references on the CPU)
      for spec in ${GDN_TEST_PROGRAMS:-new}; do
        name="${spec%%=*}" filter='*'
        [ "$spec" != "$name" ] && filter="${spec#*=}"
        if [ "$name" = new ]; then
          programs=(.device/test_cuda_delta_rule)
        else
          dir=".device/$name"
          [ -d "$dir" ] || dir="build-stage2/$name"
          programs=("$dir"/test_*)
        fi
        for program in "${programs[@]}"; do
          log="$out/variant-${name//\//-}-$(basename "$program").log" start=$SECONDS
          timeout "${GDN_TEST_TIMEOUT:-400}" "$program" --gtest_filter="$filter" >"$log" 2>&1
          status=$?
          echo "$name $(basename "$program") ($filter): exit $status in $((SECONDS - start)) s;" \
            "passed $(grep -cE '^\[       OK' "$log"), failed $(grep -cE '^\[  FAILED  \].* ms\)$' \
            "$log"), skipped $(grep -cE '^\[  SKIPPED \]' "$log")"
          grep -E "^\[  FAILED  \].* ms\)$|Failure|errors" "$log" | head -8
        done
      done ;;
    accuracy)  # every output against float64, gdn and its peers on the same inputs (a fresh
      # machine compiles the peers' kernels first: over 250 s each for FLA and FlashQLA)
      bash bench/gpu_peers.sh --part accuracy --peers gdn,fla,flashqla ;;
    peers-profile)  # FlashQLA's kernels, one forward + backward at B=1 T=65536, beside `profile`
      # (GDN_PEERS_GATES=long: with long-memory gates, which its warm-ups cannot cut)
      GDN_PEERS_RUNNER="ncu --profile-from-start off --clock-control none --metrics \
gpu__time_duration.sum" bash bench/gpu_peers.sh --peer flashqla --part profile \
        --gates "${GDN_PEERS_GATES:-mixed}" >"$out/peers-ncu.log" 2>&1
      grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" "$out/peers-ncu.log" |
        sed -E 's/^ *(void )?//; s/\(.*//; s/gpu__time_duration.sum//' | paste - - ;;
    *) echo "gpu_check: unknown stage $stage (test, cp, cp-bench, cp-sanitize, sanitize, profile, stalls, lines, bench, ab, variants, accuracy, peers-profile)"
       exit 2 ;;
  esac
done
