#!/usr/bin/env bash
# The Debian package (issue 35), built and tried as an operator would: cargo-deb builds the
# .deb from the release binary, then on this machine (as root) it is installed with dpkg -i,
# its files, user and conffile are checked, the installed binary checks the installed config
# and serves a request from a copy of it (listener moved to a free 127.0.0.1 port, run as the
# package's user), reloads on SIGHUP and stops on SIGTERM; the man page renders; a reinstall
# keeps an edited conffile; dpkg --purge removes everything (binary, unit, config, user).
# Idempotent: a veloxy package left by an earlier run is purged first. Exits non-zero on any
# failure. Called by .ci/run; run it alone with `bash .ci/deb.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

fail() {
  echo "deb.sh: FAILED: $*" >&2
  exit 1
}
step() { echo "== deb: $*"; }

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i, the veloxy system user)"
command -v dpkg >/dev/null || fail "dpkg not found: not a Debian-like machine"

# Tools: cargo-deb (built once, about a minute, cached), curl, and man-db or groff to read the
# man page.
cache="$HOME/.cache/veloxy"
cargo_deb="$cache/cargo-deb/bin/cargo-deb"
if [ ! -x "$cargo_deb" ]; then
  step "installing cargo-deb into $cache/cargo-deb (once)"
  timeout 1200 cargo install cargo-deb --locked --root "$cache/cargo-deb" \
    || fail "cargo install cargo-deb"
fi
apt_install() {
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@" \
    || { timeout 300 apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@"; }
}
command -v curl >/dev/null || apt_install curl || fail "installing curl"
if ! command -v man >/dev/null && ! command -v groff >/dev/null; then
  apt_install man-db || fail "installing man-db"
fi

step "release build"
start=$(date +%s)
cargo build --release -p veloxy
echo "release build: $(($(date +%s) - start)) s"
target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/release/veloxy"

# The generated assets, where crates/veloxy/Cargo.toml's [package.metadata.deb] expects them:
# cargo-deb maps the `target/release/` prefix of an asset to the real target directory.
step "man page and completions from the built binary"
assets="$target_dir/release/assets"
rm -rf "$assets"
mkdir -p "$assets"
"$bin" manpage | gzip -9n > "$assets/veloxy.1.gz"
"$bin" completions bash > "$assets/veloxy.bash"
"$bin" completions zsh > "$assets/_veloxy"
"$bin" completions fish > "$assets/veloxy.fish"
for f in veloxy.1.gz veloxy.bash _veloxy veloxy.fish; do
  [ -s "$assets/$f" ] || fail "empty asset $f"
done

step "cargo deb"
deb="$target_dir/debian/veloxy.deb"
rm -f "$deb"
"$cargo_deb" -p veloxy --no-build --strip --output "$deb"
[ -s "$deb" ] || fail "no .deb at $deb"
dpkg-deb --info "$deb"
ls -l "$deb"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/veloxy/veloxy.toml \
  || fail "/etc/veloxy/veloxy.toml is not a conffile"

# A package from an earlier (failed) run, and a process it left, must not get in the way.
pid=""
work=$(mktemp -d)
chmod 755 "$work"
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
  if [ "${remove_policy:-0}" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT
if dpkg-query -W -f='${Status}' veloxy 2>/dev/null | grep -q installed; then
  step "purging a veloxy package left by an earlier run"
  dpkg --purge veloxy
fi

# Where systemd runs, the package starts veloxy.service on install (port 80); a CI machine
# must not: policy-rc.d forbids it (deb-systemd-invoke honours it) for this script's dpkg runs.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  remove_policy=1
fi

# dpkg -i, failing on any complaint of a maintainer script (a shell error in one is printed
# as `/var/lib/dpkg/info/veloxy.postinst: LINE: ...` even where it does not stop the script).
install_deb() {
  dpkg -i "$deb" 2>&1 | tee "$work/dpkg.log"
  ! grep -q '/var/lib/dpkg/info/veloxy\.' "$work/dpkg.log" || fail "a maintainer script complained"
}

step "dpkg -i"
install_deb
dpkg -L veloxy
for f in /usr/bin/veloxy /etc/veloxy/veloxy.toml /usr/share/man/man1/veloxy.1.gz \
  /usr/share/bash-completion/completions/veloxy /usr/share/zsh/vendor-completions/_veloxy \
  /usr/share/fish/vendor_completions.d/veloxy.fish /usr/share/veloxy/index.html \
  /var/www/veloxy/index.html; do
  [ -s "$f" ] || fail "$f is missing after dpkg -i"
done
unit=$(dpkg -L veloxy | grep '/systemd/system/veloxy\.service$') || fail "no veloxy.service"
# shellcheck disable=SC2016 # `$MAINPID` is the unit's text, not a shell variable.
for line in User=veloxy AmbientCapabilities=CAP_NET_BIND_SERVICE \
  CapabilityBoundingSet=CAP_NET_BIND_SERVICE NoNewPrivileges=yes ProtectSystem=strict \
  ProtectHome=yes PrivateTmp=yes StateDirectory=veloxy CacheDirectory=veloxy \
  LogsDirectory=veloxy Restart=on-failure \
  'ExecStartPre=/usr/bin/veloxy check --config /etc/veloxy/veloxy.toml' \
  'ExecStart=/usr/bin/veloxy run --config /etc/veloxy/veloxy.toml' \
  'ExecReload=/bin/kill -HUP $MAINPID'; do
  grep -qxF "$line" "$unit" || fail "$unit lacks $line"
done
if command -v systemd-analyze >/dev/null; then
  # Offline: the unit's syntax (a bad value is only a warning: any output fails), that its
  # executables and man page exist, and its exposure score (0 safe .. 10 unsafe; 3.4 when
  # written) under 4.
  systemd-analyze verify "$unit" > "$work/verify.log" 2>&1 || true
  [ ! -s "$work/verify.log" ] || { cat "$work/verify.log"; fail "systemd-analyze verify $unit"; }
  systemd-analyze security --offline=true --threshold=40 --no-pager "$unit" > "$work/security.log" 2>&1 \
    || { cat "$work/security.log"; fail "systemd-analyze security: exposure above 4.0"; }
  tail -1 "$work/security.log"
fi
dpkg-query -W -f='${Conffiles}\n' veloxy | grep -q '^ /etc/veloxy/veloxy.toml ' \
  || fail "dpkg does not list /etc/veloxy/veloxy.toml as a conffile"
user=$(getent passwd veloxy) || fail "no system user veloxy"
uid=$(echo "$user" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "veloxy is not a system user (uid $uid)"
getent group veloxy >/dev/null || fail "no group veloxy"
[ "$(stat -c %U /var/lib/veloxy)" = veloxy ] || fail "/var/lib/veloxy is not veloxy's"

step "the installed veloxy checks the installed config"
/usr/bin/veloxy --version
/usr/bin/veloxy check --config /etc/veloxy/veloxy.toml \
  || fail "the installed veloxy check refuses the installed /etc/veloxy/veloxy.toml"
# Every commented-out setting (`#key`, no space) is valid too, all of them at once.
sed -E 's/^#([^ #!])/\1/' /etc/veloxy/veloxy.toml > "$work/all-settings.toml"
/usr/bin/veloxy check --config "$work/all-settings.toml" \
  || fail "the starter config's commented settings do not pass check"

step "the installed veloxy serves the installed config (on a free 127.0.0.1 port, as veloxy)"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed -E "s/^addr = \":80\"/addr = \"127.0.0.1:$port\"/" /etc/veloxy/veloxy.toml > "$work/veloxy.toml"
grep -q "127.0.0.1:$port" "$work/veloxy.toml" || fail "the starter config has no addr = \":80\" line"
chmod 644 "$work/veloxy.toml"
setpriv --reuid veloxy --regid veloxy --init-groups --no-new-privs \
  /usr/bin/veloxy run --config "$work/veloxy.toml" > "$work/log" 2>&1 &
pid=$!
# wait_for WHAT COMMAND...: polls COMMAND (10 times a second) until it succeeds, 20 s at most.
wait_for() {
  local what=$1 deadline=$(($(date +%s) + 20))
  shift
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null; then cat "$work/log"; fail "veloxy exited: $what"; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then cat "$work/log"; fail "timed out: $what"; fi
    sleep 0.1
  done
}
fetch() { curl -fsS --max-time 2 "http://127.0.0.1:$port/" -o "$work/page" 2>/dev/null; }
wait_for "the first answer on 127.0.0.1:$port" fetch
grep -q "veloxy is running" "$work/page" || fail "unexpected page: $(cat "$work/page")"
curl -sS -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$port/" | grep -qx 200 \
  || fail "GET / is not 200"
# systemctl reload = check, then SIGHUP.
/usr/bin/veloxy check --config "$work/veloxy.toml" || fail "check of the moved config"
kill -HUP "$pid"
reloaded() { grep -q "reloaded $work/veloxy.toml" "$work/log"; }
wait_for "the reload on SIGHUP" reloaded
fetch || fail "no answer after the reload"
kill -TERM "$pid"
status=0
timeout 20 tail --pid="$pid" -f /dev/null || fail "veloxy did not stop within 20 s of SIGTERM"
wait "$pid" || status=$?
pid=""
[ "$status" = 0 ] || { cat "$work/log"; fail "veloxy exited with $status after SIGTERM"; }
grep -q stopped "$work/log" || { cat "$work/log"; fail "no 'stopped' in the log"; }

step "man veloxy renders"
# Plain text from the terminal rendering: bold and underline are overstrikes (`X\bX`).
unbold() { sed -e 's/.\x08//g'; }
if command -v man >/dev/null; then
  MANWIDTH=80 man -l /usr/share/man/man1/veloxy.1.gz > "$work/man.txt" 2>"$work/man.err" \
    || { cat "$work/man.err"; fail "man -l veloxy.1.gz"; }
  if command -v mandb >/dev/null; then mandb -q 2>/dev/null || true; fi
  MANWIDTH=80 man veloxy 2>/dev/null | unbold > "$work/man-db.txt" || true
  grep -q "SYNOPSIS" "$work/man-db.txt" || fail "man veloxy does not find the page"
else
  zcat /usr/share/man/man1/veloxy.1.gz | groff -man -Tutf8 > "$work/man.txt"
fi
unbold < "$work/man.txt" > "$work/man-plain.txt"
for heading in NAME SYNOPSIS DESCRIPTION COMMANDS SIGNALS FILES; do
  grep -q "^$heading" "$work/man-plain.txt" || fail "the man page has no $heading"
done
grep -q "veloxy run" "$work/man-plain.txt" || fail "the man page lacks veloxy run"
head -12 "$work/man-plain.txt"

step "a reinstall keeps an edited conffile"
echo "# edited by deb.sh" >> /etc/veloxy/veloxy.toml
install_deb
grep -qx "# edited by deb.sh" /etc/veloxy/veloxy.toml || fail "the reinstall lost the edit"
/usr/bin/veloxy check --config /etc/veloxy/veloxy.toml || fail "check after the reinstall"

step "dpkg --purge removes everything"
dpkg --purge veloxy 2>&1 | tee "$work/dpkg.log"
! grep -q '/var/lib/dpkg/info/veloxy\.' "$work/dpkg.log" || fail "a maintainer script complained"
for f in /usr/bin/veloxy "$unit" /etc/systemd/system/multi-user.target.wants/veloxy.service /etc/veloxy /usr/share/man/man1/veloxy.1.gz \
  /usr/share/bash-completion/completions/veloxy /usr/share/veloxy /var/lib/veloxy \
  /var/cache/veloxy /var/log/veloxy /var/www/veloxy; do
  [ ! -e "$f" ] || fail "$f is still there after the purge"
done
! getent passwd veloxy >/dev/null || fail "the user veloxy is still there after the purge"
! getent group veloxy >/dev/null || fail "the group veloxy is still there after the purge"
! dpkg-query -W veloxy >/dev/null 2>&1 || fail "dpkg still knows veloxy after the purge"
echo "== deb: ok ($deb, $(stat -c %s "$deb") bytes)"
