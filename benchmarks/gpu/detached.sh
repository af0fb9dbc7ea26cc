#!/usr/bin/env bash
# A job longer than one device call (10 minutes), and inputs larger than one call may carry (64 MiB).
#
#   bash benchmarks/gpu/detached.sh pack SRC_DIR PREFIX [PART_MB[,PART_MB...]]  # here: tar SRC_DIR, split into PREFIX.partNN
#   bash benchmarks/gpu/detached.sh unpack DEST PREFIX NPARTS       # device: once all NPARTS parts are there,
#                                                                   #   join and untar them into DEST
#   bash benchmarks/gpu/detached.sh start NAME -- CMD [ARGS...]     # device: run CMD detached from this call
#   bash benchmarks/gpu/detached.sh wait NAME [SECONDS] [TAIL_LINES] # device: wait for it, print its log's tail
#
# pack writes PREFIX.part00, part01, ... of at most PART_MB (default 52) MiB each: one per call, beside the
# tree and the packages that call carries. A list (e.g. 10,23,53) sizes the first parts in order and repeats
# its last size, so the parts fill what the package archives leave of each call's carry. unpack exits 3
# (saying how many parts are there) while parts are missing; once all are there it unpacks them (into a
# staging folder, moved into DEST when whole), deletes them and leaves DEST/.unpacked-<PREFIX's name>, so a
# later call (parts no longer carried) exits 0 at once.
#
# start runs CMD in its own session (setsid), so it outlives the call that started it; its output goes to
# $DETACHED_DIR/NAME.log (default /tmp/detached), its pid to NAME.pid and, when it ends, its exit code to
# NAME.rc. A job already running under NAME is not started again (exit 3). wait polls until the job ends or
# SECONDS (default 540) pass, then prints the log's last TAIL_LINES (default 40) lines; its exit code is the
# job's, or 3 while the job still runs, so the next call waits again.
set -euo pipefail

DIR="${DETACHED_DIR:-/tmp/detached}"

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

running() {  # running NAME: the job's pid is alive and has not written its exit code
  local pid
  [ -f "$DIR/$1.pid" ] && [ ! -f "$DIR/$1.rc" ] || return 1
  pid=$(cat "$DIR/$1.pid")
  kill -0 "$pid" 2>/dev/null
}

cmd="${1:-}"; [ -n "$cmd" ] || usage; shift
case "$cmd" in
  pack)
    [ $# -ge 2 ] || usage
    src="$1" prefix="$2" mb="${3:-52}"
    [ -d "$src" ] || { echo "detached.sh pack: no directory $src" >&2; exit 2; }
    IFS=, read -r -a sizes <<< "$mb"
    for size in "${sizes[@]}"; do
      [[ "$size" =~ ^[1-9][0-9]*$ ]] || { echo "detached.sh pack: part sizes must be whole MiB > 0, got '$mb'" >&2; exit 2; }
    done
    mkdir -p "$(dirname "$prefix")"
    rm -f "$prefix".part* "$prefix".packing.part* "$prefix".packing.tar
    # written under other names, renamed once all are written: a pack killed half-way leaves no PREFIX.partNN set
    tar -C "$(dirname "$src")" -cf "$prefix.packing.tar" "$(basename "$src")"
    total=$(stat -c %s "$prefix.packing.tar") offset=0 i=0
    while [ "$offset" -lt "$total" ]; do
      size=$(( ${sizes[$(( i < ${#sizes[@]} ? i : ${#sizes[@]} - 1 ))]} * 1024 * 1024 ))
      dd if="$prefix.packing.tar" of="$(printf '%s.packing.part%02d' "$prefix" "$i")" bs=1M status=none \
        iflag=skip_bytes,count_bytes skip="$offset" count="$size"
      offset=$((offset + size)) i=$((i + 1))
    done
    rm -f "$prefix.packing.tar"
    for part in "$prefix".packing.part*; do mv "$part" "${part/.packing.part/.part}"; done
    n=$(ls "$prefix".part* | wc -l)
    echo "packed $src into $n part(s) of <= $mb MiB: $(ls "$prefix".part* | tr '\n' ' ')"
    ;;
  unpack)
    [ $# -eq 3 ] || usage
    dest="$1" prefix="$2" want="$3"
    marker="$dest/.unpacked-$(basename "$prefix")"
    if [ -f "$marker" ]; then
      echo "unpack: $prefix already unpacked into $dest"
      exit 0
    fi
    have=$(ls "$prefix".part* 2>/dev/null | wc -l)
    if [ "$have" -lt "$want" ]; then
      echo "unpack: $have of $want parts of $prefix here; carry the rest"
      exit 3
    fi
    # unpacked beside DEST first and moved in whole: a call killed half-way leaves nothing in DEST that looks
    # complete (e.g. learning_proof.sh skips its record phase when $WORK/demos exists)
    staging="$dest/.unpacking-$(basename "$prefix")"
    rm -rf "$staging" && mkdir -p "$staging"
    cat $(ls "$prefix".part* | sort) | tar -C "$staging" -xf -
    for entry in "$staging"/* "$staging"/.[!.]*; do
      [ -e "$entry" ] || continue
      rm -rf "$dest/$(basename "$entry")"
      mv "$entry" "$dest/"
    done
    rmdir "$staging"
    rm -f "$prefix".part*
    touch "$marker"
    echo "unpacked $want parts into $dest: $(ls "$dest" | tr '\n' ' ')"
    ;;
  start)
    [ $# -ge 3 ] && [ "$2" = "--" ] || usage
    name="$1"; shift 2
    mkdir -p "$DIR"
    if running "$name"; then
      echo "start: $name is already running (pid $(cat "$DIR/$name.pid")); wait for it instead" >&2
      exit 3
    fi
    rm -f "$DIR/$name.rc" "$DIR/$name.pid"
    # the wrapper records the job's exit code; setsid + nohup: the job survives the end of this call
    setsid nohup bash -c 'cd "$1" && shift && "$@"; echo $? > "$0.rc"' "$DIR/$name" "$PWD" "$@" \
      > "$DIR/$name.log" 2>&1 < /dev/null &
    echo $! > "$DIR/$name.pid"
    echo "started $name (pid $!): log $DIR/$name.log"
    ;;
  wait)
    [ $# -ge 1 ] || usage
    name="$1" seconds="${2:-540}" tail_lines="${3:-40}"
    [ -f "$DIR/$name.pid" ] || { echo "wait: no job $name in $DIR" >&2; exit 2; }
    end=$((SECONDS + seconds))
    while running "$name" && [ "$SECONDS" -lt "$end" ]; do sleep 5; done
    tail -n "$tail_lines" "$DIR/$name.log"
    if [ -f "$DIR/$name.rc" ]; then
      rc=$(cat "$DIR/$name.rc")
      echo "== $name ended with exit code $rc"
      exit "$rc"
    fi
    if running "$name"; then
      echo "== $name still running after ${seconds} s (pid $(cat "$DIR/$name.pid")); wait again"
      exit 3
    fi
    echo "== $name is gone without an exit code (killed?)"
    exit 1
    ;;
  *) usage ;;
esac
