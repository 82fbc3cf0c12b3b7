#!/usr/bin/env bash
# A real aarch64 run of the edgespec runtime on an x86_64 Debian/Ubuntu host, under qemu-user emulation.
#
#   sudo scripts/aarch64-check.sh [--real] [--tokens N] [--root DIR] [--python PY]
#
# 1. builds (once, ~10 min) or reuses an arm64 Debian bookworm root in a cache folder with debootstrap
#    (default ${XDG_CACHE_HOME:-~/.cache}/edgespec/aarch64-root; EDGESPEC_AARCH64_ROOT or --root overrides);
# 2. registers qemu's aarch64 interpreter with binfmt_misc if the kernel does not know it yet;
# 3. installs the runtime only (`pip install .`, no extras) into a venv in the root, with PyPI's aarch64 wheels;
# 4. copies an export made on this x86 machine into the root: the tiny random pair always (built here with the
#    exporter, needs `pip install -e '.[export,test]'` in PY's environment), the real default pair with --real;
# 5. runs `edgespec generate --json` (plain and spec) and a short scripted `edgespec chat` on both sides and
#    prints one verdict line: the aarch64 plain greedy ids equal the x86 ones, or first diverge where both
#    machines' logits rows show a kernel flip of the same two candidates; aarch64's speculative greedy passes
#    the verify-path rule there (edgespec/bench/evaluate.py). Exit code 0 on PASS, 1 on FAIL, 2 on bad usage.
#
# The host's /sys is NOT bound into the root: onnxruntime's CPU detection crashes on it under emulation.
# Needs root (debootstrap, chroot, mounts). Emulation is ~100x slower than native: a check, not a benchmark.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/edgespec
ROOT=${EDGESPEC_AARCH64_ROOT:-$CACHE/aarch64-root}
PY=${PYTHON:-python3}
REAL=0
TOKENS=""
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PROMPT="Write a Python function that checks whether a number is prime."

die() { echo "aarch64-check: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --real) REAL=1 ;;
    --tokens) [ $# -ge 2 ] || die "--tokens needs a number"; TOKENS=$2; shift ;;
    --root) [ $# -ge 2 ] || die "--root needs a directory"; ROOT=$2; shift ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PY=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[[ -z "$TOKENS" || "$TOKENS" =~ ^[1-9][0-9]*$ ]] || die "--tokens expects an integer >= 1, got $TOKENS"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts)"
[ "$(uname -m)" = x86_64 ] || die "meant for an x86_64 host (this is $(uname -m); on a Pi just pip install .)"
"$PY" -c "import edgespec" 2>/dev/null || die "$PY cannot import edgespec (pip install -e '.[export,test]')"
if [ $REAL = 1 ]; then
  EXPORT=$("$PY" -c "from edgespec import paths; print(paths.default_export_dir())")
  [ -f "$EXPORT/edgespec.json" ] || die "no real export at $EXPORT (run edgespec export first)"
  LABEL=real; TOKENS=${TOKENS:-32}; CHAT_TOKENS=12
else
  EXPORT=$CACHE/aarch64-check/tiny-export
  LABEL=tiny; TOKENS=${TOKENS:-32}; CHAT_TOKENS=16
fi
step() { echo "[$(date -u +%H:%M:%S)] $*"; }

# -- 1. tools and binfmt --------------------------------------------------------------------------------------
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ -x /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi
BINFMT=/proc/sys/fs/binfmt_misc
[ -e $BINFMT/register ] || mount -t binfmt_misc binfmt_misc $BINFMT
if [ ! -e $BINFMT/qemu-aarch64 ]; then
  step "registering /usr/bin/qemu-aarch64-static for aarch64 ELF binaries"
  # F: the kernel opens the interpreter now, so it works inside the chroot without a copy there
  echo ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F' > $BINFMT/register
fi

# -- 2. the arm64 root ------------------------------------------------------------------------------------------
if [ ! -f "$ROOT/.edgespec-root" ]; then
  step "building an arm64 Debian bookworm root in $ROOT (about 10 minutes)"
  rm -rf "$ROOT.partial"
  mkdir -p "$(dirname "$ROOT")"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$ROOT.partial" "$MIRROR" >/dev/null
  date -u +%FT%TZ > "$ROOT.partial/.edgespec-root"
  rm -rf "$ROOT" && mv "$ROOT.partial" "$ROOT"
else
  step "reusing the arm64 root $ROOT (built $(cat "$ROOT/.edgespec-root"))"
fi
W=/opt/edgespec-check
MOUNTS=()
cleanup() { for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" || true; done; }
trap cleanup EXIT
mnt() { mountpoint -q "$2" || { mount "${@:3}" "$1" "$2"; MOUNTS+=("$2"); }; }
mnt proc "$ROOT/proc" -t proc
mnt /dev "$ROOT/dev" --bind            # /dev/null, /dev/urandom; no /sys (see above)
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/edgespec-host-ca.crt"
# onnxruntime's cpuinfo complains on stderr about the missing /sys (harmless: generic kernels); those lines are dropped
arm() { chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/edgespec-venv/bin:/usr/bin:/bin \
          PIP_CERT=/etc/edgespec-host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@" 2> >(grep -v cpuinfo >&2); }
[ "$(arm uname -m)" = aarch64 ] || die "the root does not run as aarch64 (binfmt registration failed?)"

# -- 3. the runtime, no extras ----------------------------------------------------------------------------------
step "installing the runtime into $ROOT$W (pip install ., aarch64 wheels)"
rm -rf "$ROOT$W/src" && mkdir -p "$ROOT$W/src" "$ROOT$W/export"
(cd "$REPO" && git ls-files -co --exclude-standard -z | grep -zv '^bench/results/' | tar --null -T - -cf -) | tar -C "$ROOT$W/src" -xf -
arm test -x /opt/edgespec-venv/bin/python || arm python3 -m venv /opt/edgespec-venv
arm pip uninstall -q -y edgespec >/dev/null 2>&1 || true
arm pip install -q "$W/src"
arm python -c "import platform, onnxruntime as o; print('  python', platform.python_version(), platform.machine(), \
'| onnxruntime', o.__version__, o.get_available_providers())"
echo "  wheels: $(arm pip list --format=freeze 2>/dev/null | grep -iE '^(onnxruntime|numpy|tokenizers|jinja2|edgespec)==' | tr '\n' ' ')"

# -- 4. the export ----------------------------------------------------------------------------------------------
[ $REAL = 1 ] || "$PY" "$REPO/scripts/aarch64_ref.py" tiny "$EXPORT" 2>/dev/null
step "copying the $LABEL export $EXPORT into the root"
rm -rf "$ROOT$W/export" && cp -r "$EXPORT" "$ROOT$W/export"

# -- 5. both sides: generate (plain, spec) and a scripted chat -------------------------------------------------
RES=$CACHE/aarch64-check/results-$LABEL
rm -rf "$RES" && mkdir -p "$RES"
CHAT=$(printf 'Write a haiku about a small computer.\n/stats\nNow one about the sea.\n/exit\n')
for side in x86 aarch64; do
  if [ $side = x86 ]; then run() { "$PY" -m edgespec.cli "$@"; }; E=$EXPORT
  else run() { arm edgespec "$@"; }; E=$W/export; fi
  # spec with a fixed K: adaptive K prices the draft from timings, and under emulation it may never draft
  for mode in plain spec; do
    k=(); [ $mode = spec ] && k=(--k 4)
    step "$side: edgespec generate --json --mode $mode ${k[*]} --max-new-tokens $TOKENS"
    run generate "$E" --json --mode $mode "${k[@]}" --max-new-tokens "$TOKENS" --prompt "$PROMPT" > "$RES/$side-$mode.json"
  done
  step "$side: edgespec chat (2 turns, --max-new-tokens $CHAT_TOKENS)"
  printf '%s\n' "$CHAT" | run chat "$E" --max-new-tokens $CHAT_TOKENS > "$RES/$side-chat.txt" 2> "$RES/$side-chat.err"
  sed 's/^/  | /' "$RES/$side-chat.txt" "$RES/$side-chat.err"
done
for side in x86 aarch64; do
  echo "  $side plain ids: $("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['token_ids'])" "$RES/$side-plain.json")"
done
# the lossless rule (edgespec/bench/evaluate.py): aarch64's spec run against its own verify calls, replayed there;
# a plain divergence across the machines judged by both machines' rows at that token
step "aarch64: speculative vs plain greedy under the verify-path rule (K = 4)"
arm python "$W/src/scripts/aarch64_ref.py" greedy "$W/export" "$PROMPT" "$TOKENS" 4 "$W/greedy.json"
cp "$ROOT$W/greedy.json" "$RES/aarch64-greedy.json"
DIV=$("$PY" "$REPO/scripts/aarch64_ref.py" divergence "$RES")
if [ -n "$DIV" ]; then
  step "aarch64: its plain-path logits at the divergence (token $DIV)"
  cp "$RES/x86-plain.json" "$ROOT$W/x86-plain.json"
  arm python "$W/src/scripts/aarch64_ref.py" row "$W/export" "$PROMPT" "$W/x86-plain.json" "$DIV" "$W/row.npy"
  cp "$ROOT$W/row.npy" "$RES/aarch64-row.npy"
fi
echo "  results in $RES"
"$PY" "$REPO/scripts/aarch64_ref.py" verdict "$EXPORT" "$PROMPT" "$RES" "$LABEL"
