# Sourced by the GPU runners (tests/gpu/run_on_device.sh, bench/run_on_device.sh).
#
# owned LOG CMD...  runs CMD with its output shown and written to LOG, as a child that
# goes when the runner goes: a TERM, INT or HUP sent to the runner (its own timeout, a
# Ctrl-C, a closed session) is passed on to CMD, and the runner waits for CMD to end.
# Run in the foreground instead, CMD would outlive a stopped runner and share the GPU
# with the next job (two suites did so once: bench/README.md, prediction step 17).
# Returns CMD's exit status (128 + the signal's number when it was stopped). A SIGKILL
# of the runner cannot be passed on.
owned() {
  local log=$1 out
  shift
  exec {out}> >(tee "$log")
  local tee_pid=$!
  "$@" >&"$out" 2>&1 &
  local pid=$!
  exec {out}>&-
  # shellcheck disable=SC2064  # the child's pid is fixed now
  trap "kill -TERM $pid 2>/dev/null" TERM INT HUP
  local rc=0
  wait "$pid" || rc=$?
  # A trapped signal ends `wait` early: wait for the child itself to end.
  while kill -0 "$pid" 2>/dev/null; do
    rc=0
    wait "$pid" || rc=$?
  done
  trap - TERM INT HUP
  wait "$tee_pid" 2>/dev/null || true # the log is whole before the caller reads it
  return "$rc"
}

# pack_out DIR NAME  packs every file under DIR (but earlier packs, *.tar.gz) into
# DIR/NAME.tar.gz and removes them, so that a device call, which brings back at most 8
# files from $OUT, brings back every record of many benchmarks: set PACK=1 for
# bench/run_on_device.sh (records were lost to that limit in steps 48 and 57). Unpack here
# with `tar -xzf`. Nothing is removed unless the archive was written whole.
pack_out() {
  local dir=$1 name=$2 files=()
  mapfile -t files < <(cd "$dir" && find . -type f ! -name '*.tar.gz' | sort)
  [ "${#files[@]}" -gt 0 ] || return 0
  tar -czf "$dir/$name.tar.gz.part" -C "$dir" "${files[@]}" &&
    mv "$dir/$name.tar.gz.part" "$dir/$name.tar.gz" &&
    (cd "$dir" && rm -f "${files[@]}")
}
