#!/usr/bin/env bash
# strata-run, end to end: strata_run_test.sh STRATA_RUN CASE WORKDIR
#
# The ranks are small bash programs that write their pid (and what they saw) into a fresh folder
# under WORKDIR. Every case bounds its own time (timeout, a watchdog) and checks afterwards that no
# rank, nor a process a rank started, is still alive; whatever is left is killed on the way out.
set -u

run=$1
case_name=$2
mkdir -p "$3"
dir=$(mktemp -d "$3/strata_run.XXXXXX")
limit=60 # seconds; the ranks that should be stopped sleep 300

fail() {
  echo "FAIL ($case_name): $*"
  for f in "$dir"/out "$dir"/err; do
    [ -f "$f" ] && { echo "--- ${f##*/}:"; cat "$f"; }
  done
  exit 1
}

# Alive: exists and is not a zombie (an orphan that nobody reaped yet is gone for our purpose).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

pids() { cat "$dir"/pid.* "$dir"/gpid.* 2>/dev/null; }

cleanup() {
  for pid in $(pids); do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

# After strata-run returned: no rank and no process a rank started may be alive.
check_none_left() {
  local count=0
  for pid in $(pids); do
    count=$((count + 1))
    alive "$pid" && fail "pid $pid (a rank or its child) outlived strata-run"
  done
  [ "$count" -ge "$1" ] || fail "expected at least $1 pid files, found $count"
}

# Runs strata-run in the foreground with a time limit; sets rc.
run_bounded() {
  timeout -k 5 "$limit" "$run" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" -ne 124 ] || fail "strata-run did not return within ${limit}s"
}

# Starts strata-run in the background (launcher=its pid) under a watchdog, and waits until $N
# ranks recorded their pid; wait_for_launcher sets rc.
start_in_background() {
  "$run" "$@" >"$dir/out" 2>"$dir/err" &
  launcher=$!
  # The watchdog takes its sleep with it when it is told to stop.
  (
    trap 'kill "$nap"; exit 0' TERM
    sleep "$limit" &
    nap=$!
    wait "$nap" && kill -KILL "$launcher"
  ) >/dev/null 2>&1 &
  watchdog=$!
  for _ in $(seq 600); do
    [ "$(ls "$dir"/pid.* 2>/dev/null | wc -l)" -ge "$N" ] && break
    sleep 0.1
  done
}
wait_for_launcher() {
  wait "$launcher"
  rc=$?
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

expect_rc() { [ "$rc" -eq "$1" ] || fail "exit status $rc, expected $1"; }

expect_err() {
  grep -Eq "$1" "$dir/err" || fail "stderr does not match '$1'"
  [ "$(wc -l <"$dir/err")" -eq 1 ] || fail "stderr is not exactly one line"
}

# Rank program helpers (bash): record the pid, wait until N ranks did.
record='echo $$ > "$D/pid.$RANK"'
wait_for='for i in $(seq 600); do [ $(ls "$D"/pid.* 2>/dev/null | wc -l) -ge $N ] && break; sleep 0.1; done'
export D=$dir

case $case_name in
  env)
    # Three ranks, each sees its own RANK and the same world; the launch variables already in the
    # environment are replaced, the rest inherited; strata-run itself prints nothing.
    export RANK=99 WORLD_SIZE=99 MASTER_PORT=1 INHERITED_BY_RANKS=yes
    run_bounded -n 3 bash -c "$record"'
      echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $INHERITED_BY_RANKS" > "$D/env.$RANK"
      echo "hello from $RANK"'
    expect_rc 0
    [ -s "$dir/err" ] && fail "strata-run wrote to stderr on success"
    [ "$(sort "$dir/out")" = "$(printf 'hello from %s\n' 0 1 2)" ] || fail "stdout is not the ranks' output"
    port=""
    for r in 0 1 2; do
      [ -f "$dir/env.$r" ] || fail "no rank saw RANK=$r"
      read -r rank world local_rank local_world addr p inherited <"$dir/env.$r"
      [ "$rank $world $local_rank $local_world $addr $inherited" = "$r 3 $r 3 127.0.0.1 yes" ] ||
        fail "rank $r saw '$(cat "$dir/env.$r")'"
      [ -z "$port" ] && port=$p
      [ "$p" = "$port" ] || fail "ranks saw different ports: $port and $p"
    done
    [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] && [ "$port" != 1 ] ||
      fail "MASTER_PORT '$port' is not a chosen free port"
    check_none_left 3
    # --port and --master-addr are passed on as given; flags after PROGRAM are PROGRAM's.
    rm -f "$dir"/pid.*
    run_bounded --port=29511 --master-addr localhost -n 1 -- bash -c \
      "$record"'; echo "$MASTER_ADDR $MASTER_PORT $WORLD_SIZE $1 $2"' _ -n 7
    expect_rc 0
    [ "$(cat "$dir/out")" = "localhost 29511 1 -n 7" ] || fail "--port/--master-addr: '$(cat "$dir/out")'"
    check_none_left 1
    ;;

  fail_exit)
    # Rank 2 exits 3 while the others sleep; rank 0 also started a child of its own.
    export N=3
    run_bounded -n 3 bash -c 'if [ "$RANK" = 0 ]; then sleep 300 & echo $! > "$D/gpid.0"; fi
      '"$record"'
      if [ "$RANK" = 2 ]; then '"$wait_for"'; exit 3; fi
      exec sleep 300'
    expect_rc 3
    expect_err '^strata-run: rank 2 \(pid '"$(cat "$dir/pid.2")"'\) exited with status 3; stopped ranks 0, 1$'
    [ -f "$dir/gpid.0" ] || fail "rank 0 did not start its child"
    check_none_left 4
    ;;

  kill_signal)
    export N=2
    run_bounded -n 2 bash -c "$record"'
      if [ "$RANK" = 1 ]; then '"$wait_for"'; kill -KILL $$; fi
      exec sleep 300'
    expect_rc 137
    expect_err '^strata-run: rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\); stopped ranks 0$'
    check_none_left 2
    ;;

  grace_kill)
    # Rank 0 ignores SIGTERM (and so does the sleep it becomes): only SIGKILL after the grace
    # stops it.
    export N=2
    run_bounded -n 2 --grace 0.5 bash -c 'trap "" TERM; '"$record"'
      if [ "$RANK" = 1 ]; then '"$wait_for"'; exit 1; fi
      exec sleep 300'
    expect_rc 1
    expect_err '^strata-run: rank 1 \(pid [0-9]+\) exited with status 1; stopped ranks 0 \(SIGKILL after the 0.5 s grace: ranks 0\)$'
    check_none_left 2
    ;;

  forward_sigterm | forward_sighup)
    sig=${case_name#forward_sig}
    sig=${sig^^}
    # A signal ignored when strata-run starts (nohup) is left alone by design: nothing to test.
    number=$(kill -l "$sig")
    ignored=$(awk '/^SigIgn:/ {print $2}' /proc/self/status)
    if (((16#$ignored >> (number - 1)) & 1)); then
      echo "SIG$sig is ignored in this environment: skipped"
      exit 77
    fi
    # Each rank notes the signal it got and exits 0; strata-run still reports the signal.
    export N=2
    start_in_background -n 2 --grace 30 bash -c 'trap "echo got > \"\$D/sig.\$RANK\"; exit 0" '"$sig"'
      sleep 300 & echo $! > "$D/gpid.$RANK"
      '"$record"'; wait'
    kill -"$sig" "$launcher"
    wait_for_launcher
    expect_rc $((128 + number))
    expect_err "^strata-run: got SIG$sig \\(signal $number\\); forwarded it to ranks 0, 1$"
    [ -f "$dir/sig.0" ] && [ -f "$dir/sig.1" ] || fail "the ranks did not get SIG$sig"
    check_none_left 4
    ;;

  launcher_killed)
    # strata-run dies without a chance to clean up: the ranks die with it (PR_SET_PDEATHSIG).
    export N=3
    start_in_background -n 3 bash -c "$record"'; exec sleep 300'
    kill -KILL "$launcher"
    wait_for_launcher
    expect_rc 137
    for _ in $(seq 300); do
      left=0
      for pid in $(pids); do alive "$pid" && left=1; done
      [ "$left" = 0 ] && break
      sleep 0.1
    done
    check_none_left 3
    ;;

  tag_output)
    # Partial lines wait for their newline; a last line without one gets it.
    run_bounded -n 2 --tag-output bash -c 'echo "out $RANK"; printf part; sleep 0.2
      printf "ial $RANK\n"; echo "err $RANK" >&2; printf "tail $RANK"'
    expect_rc 0
    expected_out=$(for r in 0 1; do printf '[rank %s] %s\n' $r "out $r" $r "partial $r" $r "tail $r"; done | sort)
    [ "$(sort "$dir/out")" = "$expected_out" ] || fail "stdout is not tagged line by line"
    [ "$(sort "$dir/err")" = "$(printf '[rank %s] err %s\n' 0 0 1 1)" ] || fail "stderr is not tagged"
    [ "$(tail -c 1 "$dir/out" | od -An -c | tr -d ' ')" = '\n' ] || fail "stdout does not end a line"
    ;;

  nodes_env)
    # Two nodes' launchers on loopback (--nnodes, --node-rank, torchrun's spellings on node 1):
    # RANK = node x 2 + local rank, every rank sees the same world and the same MASTER_PORT, which
    # node 0 chose for the ranks (not the launchers' --port).
    port=$(free_port)
    prog='echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE $MASTER_ADDR $MASTER_PORT" > "$D/env.$RANK"'
    timeout -k 5 "$limit" "$run" --nnodes=2 --node-rank=0 --port="$port" -n 2 bash -c "$record; $prog" \
      >"$dir/out0" 2>"$dir/err0" &
    node0=$!
    run_bounded --nnodes 2 --node_rank 1 --master_port "$port" --nproc-per-node=2 bash -c "$record; $prog"
    expect_rc 0
    wait "$node0" || fail "node 0's launcher exited $?: $(cat "$dir/err0")"
    seen=""
    for r in 0 1 2 3; do
      [ -f "$dir/env.$r" ] || fail "no rank saw RANK=$r"
      read -r rank world local_rank local_world group group_world addr p <"$dir/env.$r"
      [ "$rank $world $local_rank $local_world $group $group_world $addr" = \
        "$r 4 $((r % 2)) 2 $((r / 2)) 2 127.0.0.1" ] || fail "rank $r saw '$(cat "$dir/env.$r")'"
      [ -z "$seen" ] && seen=$p
      [ "$p" = "$seen" ] && [ "$p" != "$port" ] || fail "ranks' MASTER_PORT $p (first $seen, --port $port)"
    done
    check_none_left 4
    ;;

  nodes_disagree)
    # Node 1 starts 3 ranks where node 0 starts 2: both launchers name every node's count, exit 1,
    # and no rank starts.
    port=$(free_port)
    timeout -k 5 "$limit" "$run" --nnodes=2 --node-rank=0 --port="$port" -n 2 bash -c "$record" \
      >"$dir/out0" 2>"$dir/err0" &
    node0=$!
    run_bounded --nnodes=2 --node-rank=1 --port="$port" -n 3 bash -c "$record"
    expect_rc 1
    wait "$node0"
    [ $? -eq 1 ] || fail "node 0's launcher did not exit 1"
    pattern='the nodes disagree on the number of ranks per node: node 0 \(127.0.0.1\) -n 2, node 1 \(127.0.0.1\) -n 3'
    expect_err "^strata-run: node 1 of 2: $pattern"
    grep -Eq "^strata-run: node 0 of 2: $pattern" "$dir/err0" || fail "node 0 said: $(cat "$dir/err0")"
    [ -z "$(pids)" ] || fail "a rank started"
    ;;

  nodes_unreachable)
    # Node 1 alone: nobody serves the rendezvous; it gives up after STRATA_COMM_TIMEOUT with the
    # address and the fix. Node 0 alone: node 1 never comes.
    port=$(free_port)
    STRATA_COMM_TIMEOUT=1s run_bounded --nnodes=2 --node-rank=1 --port="$port" -n 2 bash -c "$record"
    expect_rc 1
    expect_err "^strata-run: node 1 of 2 cannot reach the nodes' rendezvous at 127.0.0.1:$port within 1 s \(STRATA_COMM_TIMEOUT\): .*Start node 0 \(--node-rank=0\)"
    STRATA_COMM_TIMEOUT=1s run_bounded --nnodes=3 --node-rank=0 --port="$port" -n 2 bash -c "$record"
    expect_rc 1
    expect_err "^strata-run: node 0 of 3: nodes 1, 2 did not join the nodes' rendezvous at 127.0.0.1:$port within 1 s \(STRATA_COMM_TIMEOUT\)"
    [ -z "$(pids)" ] || fail "a rank started"
    ;;

  nodes_duplicate)
    # Two launchers say --node-rank=1: the second to join is told at once; the first, like node
    # 0, waits for the node that never came and names it.
    port=$(free_port)
    export STRATA_COMM_TIMEOUT=1.5s
    timeout -k 5 "$limit" "$run" --nnodes=3 --node-rank=0 --port="$port" -n 1 bash -c "$record" \
      >"$dir/out0" 2>"$dir/err0" &
    node0=$!
    timeout -k 5 "$limit" "$run" --nnodes=3 --node-rank=1 --port="$port" -n 1 bash -c "$record" \
      >"$dir/out1" 2>"$dir/err1" &
    node1=$!
    run_bounded --nnodes=3 --node-rank=1 --port="$port" -n 1 bash -c "$record"
    expect_rc 1
    wait "$node1"
    [ $? -eq 1 ] || fail "the other node-1 launcher did not exit 1"
    wait "$node0"
    [ $? -eq 1 ] || fail "node 0's launcher did not exit 1"
    told="^strata-run: node 1 of 3: another strata-run already joined the nodes' rendezvous at 127.0.0.1:$port as --node-rank=1 \(from 127.0.0.1\): give each machine its own --node-rank, from 0 to 2$"
    waited="^strata-run: node 0 of 3: node 2 did not join"
    if grep -Eq "$told" "$dir/err"; then other=$dir/err1; else other=$dir/err; fi
    grep -Eq "$told" "$dir/err" "$dir/err1" || fail "no launcher was told of the duplicate: $(cat "$dir/err" "$dir/err1")"
    # (node 0 may give up and close the rendezvous a moment before the first node 1 looks
    # which nodes are missing)
    grep -Eq "^strata-run: node 1 of 3: (node 2|some nodes) did not join" "$other" ||
      fail "the first node 1 said: $(cat "$other")"
    grep -Eq "$waited" "$dir/err0" || fail "node 0 said: $(cat "$dir/err0")"
    [ -z "$(pids)" ] || fail "a rank started"
    ;;

  *)
    echo "unknown case '$case_name'"
    exit 2
    ;;
esac
echo "strata-run $case_name ok"
