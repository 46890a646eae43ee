#!/bin/sh
# Installs Berth from this unpacked release tarball under a prefix, in the same layout as the
# .deb: PREFIX/bin/berth, the plugins in PREFIX/lib/berth/plugins (where the binary looks for
# them), man pages, shell completions and notices under PREFIX/share.
#
# Usage: ./install.sh [--prefix DIR] [--destdir DIR] [--service] [--uninstall]
#   --prefix DIR   install under DIR (default /usr/local)
#   --destdir DIR  stage under DIR/PREFIX instead of PREFIX (for building other packages)
#   --service      also (as root) create the `berth` system user, /etc/berth/berth.toml (kept if
#                  present), /var/lib/berth and /var/cache/berth, and the systemd unit
#                  /etc/systemd/system/berth.service, enabled and started when systemd runs
#   --uninstall    remove what an install with the same --prefix/--destdir put there (the
#                  service's user, config and store are kept)
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=/usr/local
destdir=
service=no
uninstall=no
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
        --destdir=*) destdir=${1#*=}; shift ;;
        --service) service=yes; shift ;;
        --uninstall) uninstall=yes; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$prefix" in
    /*) ;;
    *) echo "install.sh: --prefix must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
root="$destdir$prefix"

# Every file this tarball installs, relative to the prefix (the tarball's own tree).
files() {
    (cd "$here" && find bin lib/berth share -type f | LC_ALL=C sort)
}

if [ "$uninstall" = yes ]; then
    files | while read -r f; do rm -f "$root/$f"; done
    # Then the directories the install made that are empty now (never the prefix's bin/ or share/).
    (cd "$here" && find bin lib/berth share -mindepth 1 -depth -type d) | while read -r d; do
        rmdir "$root/$d" 2>/dev/null || true
    done
    rmdir "$root/lib/berth" 2>/dev/null || true
    if [ "$service" = yes ] && [ -f /etc/systemd/system/berth.service ]; then
        if [ -d /run/systemd/system ]; then systemctl disable --now berth.service || true; fi
        rm -f /etc/systemd/system/berth.service
    fi
    echo "removed Berth from $root"
    exit 0
fi

files | while read -r f; do
    mode=0644
    case "$f" in bin/*) mode=0755 ;; esac
    install -D -m "$mode" "$here/$f" "$root/$f"
done
echo "installed $root/bin/berth (plugins in $root/lib/berth/plugins)"

if [ "$service" = yes ]; then
    if [ "$(id -u)" != 0 ] && [ -z "$destdir" ]; then
        echo "install.sh: --service needs root" >&2
        exit 1
    fi
    etc="$destdir/etc"
    if [ -z "$destdir" ] && ! getent passwd berth >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/berth --no-create-home \
            --shell /usr/sbin/nologin --comment "Berth LLM server" berth
    fi
    if [ -z "$destdir" ]; then
        install -d -o berth -g berth -m 0750 /var/lib/berth /var/cache/berth
    fi
    if [ ! -f "$etc/berth/berth.toml" ]; then
        install -D -m 0640 "$here/etc/berth/berth.toml" "$etc/berth/berth.toml"
        [ -n "$destdir" ] || chown root:berth "$etc/berth/berth.toml"
    fi
    mkdir -p "$etc/systemd/system"
    sed "s|/usr/bin/berth|$prefix/bin/berth|" "$here/lib/systemd/system/berth.service" \
        >"$etc/systemd/system/berth.service"
    chmod 0644 "$etc/systemd/system/berth.service"
    echo "installed $etc/systemd/system/berth.service (config $etc/berth/berth.toml)"
    if [ -z "$destdir" ] && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl enable --now berth.service
        echo "started berth.service (http://127.0.0.1:11435/health)"
    fi
fi
