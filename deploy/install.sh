#!/usr/bin/env bash
# Install (or upgrade) dflash-sidecar on a training box: the daemon in its own virtual
# environment, its systemd units, config, env file, system user and socket directory.
# Idempotent: running it again changes nothing that is already right. See docs/DEPLOY.md.
set -euo pipefail

PROG=install.sh
DEPLOY_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
SHIPPED_PREFIX=/opt/dflash-sidecar   # the path written in the shipped unit files
NEW_ENOUGH='import sys; sys.exit(sys.version_info < (3, 11))'

usage() {
    cat <<EOF
Usage: deploy/install.sh [options]

Installs dflash-sidecar into PREFIX/venv and installs:
  /etc/systemd/system/dflash-sidecar.service      (--wandb-run auto)
  /etc/systemd/system/dflash-sidecar@.service     (instance = W&B run id)
  /etc/dflash-sidecar/config.toml                 (kept if present; the new one goes to config.toml.dist)
  /etc/dflash-sidecar/env                         (WANDB_API_KEY=..., mode 0600, never overwritten)
  /etc/sysusers.d/dflash-sidecar.conf, /etc/tmpfiles.d/dflash-sidecar.conf
  PREFIX/share/                                   (drop-in example, Prometheus, Grafana, docs)
then creates the dflash-sidecar user, the socket directory, and runs systemctl daemon-reload.

Options:
  --source DIR       install the daemon from this source tree (default: the repository this
                     script is in: $(dirname -- "$DEPLOY_DIR"))
  --wheel FILE       install the daemon from this wheel instead
  --python PY        interpreter for the virtual environment, Python >= 3.11 (default: python3)
  --prefix DIR       installation directory (default: $SHIPPED_PREFIX)
  --pip-arg ARG      extra argument for pip install, repeatable (air-gapped box:
                     --pip-arg=--no-index --pip-arg=--find-links=/srv/wheels)
  --trainer-user U   add user U (who runs the trainer) to group dflash-sidecar, repeatable
  --upgrade          afterwards restart the sidecar units that are running (systemctl
                     try-restart); nothing else is restarted: the training run keeps going
  --root DIR         install into the scratch root DIR (tests, image builds): no user,
                     no tmpfiles, no systemctl; the venv's scripts point inside DIR
  -h, --help         show this help
EOF
}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage_error() { printf '%s: error: %s\n(see %s --help)\n' "$PROG" "$*" "$PROG" >&2; exit 2; }
say() { printf '%s: %s\n' "$PROG" "$*"; }

SOURCE=""
WHEEL=""
PYTHON=python3
PREFIX=$SHIPPED_PREFIX
ROOT=""
UPGRADE=0
PIP_ARGS=()
TRAINER_USERS=()

need_value() { [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --source) need_value "$@"; SOURCE=$2; shift 2 ;;
        --source=*) SOURCE=${1#*=}; shift ;;
        --wheel) need_value "$@"; WHEEL=$2; shift 2 ;;
        --wheel=*) WHEEL=${1#*=}; shift ;;
        --python) need_value "$@"; PYTHON=$2; shift 2 ;;
        --python=*) PYTHON=${1#*=}; shift ;;
        --prefix) need_value "$@"; PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --pip-arg) need_value "$@"; PIP_ARGS+=("$2"); shift 2 ;;
        --pip-arg=*) PIP_ARGS+=("${1#*=}"); shift ;;
        --trainer-user) need_value "$@"; TRAINER_USERS+=("$2"); shift 2 ;;
        --trainer-user=*) TRAINER_USERS+=("${1#*=}"); shift ;;
        --upgrade) UPGRADE=1; shift ;;
        --root) need_value "$@"; ROOT=$2; shift 2 ;;
        --root=*) ROOT=${1#*=}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage_error "unknown option: $1" ;;
    esac
done

# ---- validate everything before touching anything ---------------------------------------------

[[ -z $SOURCE || -z $WHEEL ]] || usage_error "give --source or --wheel, not both"
[[ $PREFIX == /* && $PREFIX != / ]] || usage_error "--prefix must be an absolute directory, got '$PREFIX'"
PREFIX=${PREFIX%/}
[[ $PREFIX =~ ^[A-Za-z0-9._/+-]+$ ]] || usage_error "--prefix may only contain letters, digits and . _ / + -"
if [[ -n $ROOT ]]; then
    mkdir -p -- "$ROOT" || die "cannot create --root $ROOT"
    ROOT=$(cd -- "$ROOT" && pwd)
    [[ $ROOT != / ]] || usage_error "--root / is the live system: leave --root out instead"
elif [[ $(id -u) -ne 0 ]]; then
    die "installing on the live system needs root (or give --root DIR for a scratch install)"
fi
if [[ -n $WHEEL ]]; then
    [[ -f $WHEEL && $WHEEL == *.whl ]] || die "--wheel $WHEEL: no such wheel file"
    WHEEL=$(cd -- "$(dirname -- "$WHEEL")" && pwd)/$(basename -- "$WHEEL")
else
    SOURCE=${SOURCE:-$(dirname -- "$DEPLOY_DIR")}
    [[ -f $SOURCE/pyproject.toml ]] || die "--source $SOURCE: not a source tree (no pyproject.toml)"
    SOURCE=$(cd -- "$SOURCE" && pwd)
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "--python $PYTHON: not found"
"$PYTHON" -c "$NEW_ENOUGH" \
    || die "--python $PYTHON is $("$PYTHON" -V 2>&1); dflash-sidecar needs Python >= 3.11"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "--python $PYTHON cannot create virtual environments (Debian/Ubuntu: apt-get install python3-venv)"
for f in dflash-sidecar.service dflash-sidecar@.service dflash-sidecar.sysusers dflash-sidecar.tmpfiles \
         env.template resources.conf.example; do
    [[ -f $DEPLOY_DIR/systemd/$f ]] || die "incomplete deploy directory: $DEPLOY_DIR/systemd/$f is missing"
done
if [[ -z $ROOT && ${#TRAINER_USERS[@]} -gt 0 ]]; then
    for u in "${TRAINER_USERS[@]}"; do
        id -u -- "$u" >/dev/null 2>&1 || die "--trainer-user $u: no such user"
    done
fi

VENV=$ROOT$PREFIX/venv
ETC=$ROOT/etc/dflash-sidecar
UNIT_DIR=$ROOT/etc/systemd/system
SHARE=$ROOT$PREFIX/share
SIDECAR_UNITS=(dflash-sidecar.service 'dflash-sidecar@*.service')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-sidecar-install.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT

# put SRC at DEST with MODE unless it is already there, byte for byte and with that mode
put() {
    local src=$1 dest=$2 mode=$3
    if [[ -f $dest ]] && cmp -s -- "$src" "$dest" && [[ $(stat -c %a -- "$dest") == "${mode#0}" ]]; then
        return 0
    fi
    install -D -m "$mode" -- "$src" "$dest"
    say "installed ${dest#"$ROOT"}"
}

# a shipped file with /opt/dflash-sidecar replaced by PREFIX
put_prefixed() {
    local src=$1 dest=$2 mode=$3 tmp
    tmp=$WORK/$(basename -- "$dest")
    sed "s#$SHIPPED_PREFIX#$PREFIX#g" -- "$src" >"$tmp"
    put "$tmp" "$dest" "$mode"
}

# ---- the virtual environment -------------------------------------------------------------------

if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c "$NEW_ENOUGH" 2>/dev/null; then
    say "using the virtual environment ${VENV#"$ROOT"}"
else
    say "creating the virtual environment ${VENV#"$ROOT"} ($("$PYTHON" -V 2>&1))"
    mkdir -p -- "$(dirname -- "$VENV")"
    "$PYTHON" -m venv --clear -- "$VENV" || die "cannot create the virtual environment $VENV"
fi

if [[ -n $WHEEL ]]; then
    TARGET=$WHEEL
else
    # Build from a copy, so pip's in-tree build leaves no root-owned build/ in the checkout.
    TARGET=$WORK/src
    mkdir -p -- "$TARGET"
    tar -C "$SOURCE" --anchored --exclude=./.git --exclude=./.venv --exclude=./venv --exclude=./build \
        --exclude=./dist --exclude=./.tmp --exclude=./wandb --no-anchored --exclude='*.egg-info' \
        --exclude=__pycache__ -cf - . | tar -C "$TARGET" -xf -
fi
say "installing dflash-sidecar from ${WHEEL:-$SOURCE}"
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet --upgrade \
    ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} -- "${TARGET}[daemon]" \
    || die "pip install failed (no network? use --wheel and --pip-arg=--no-index --pip-arg=--find-links=DIR)"
[[ -x $VENV/bin/dflash-sidecar ]] || die "pip did not install $VENV/bin/dflash-sidecar"

# ---- units, user, socket directory -------------------------------------------------------------

for unit in dflash-sidecar.service dflash-sidecar@.service; do
    put_prefixed "$DEPLOY_DIR/systemd/$unit" "$UNIT_DIR/$unit" 0644
done
put "$DEPLOY_DIR/systemd/dflash-sidecar.sysusers" "$ROOT/etc/sysusers.d/dflash-sidecar.conf" 0644
put "$DEPLOY_DIR/systemd/dflash-sidecar.tmpfiles" "$ROOT/etc/tmpfiles.d/dflash-sidecar.conf" 0644

# ---- config and secrets ------------------------------------------------------------------------

install -d -m 0755 -- "$ETC"
CONFIG=$WORK/config.toml
if [[ -f $DEPLOY_DIR/config.toml ]]; then
    cp -- "$DEPLOY_DIR/config.toml" "$CONFIG"
else
    "$VENV/bin/dflash-sidecar" sample-config >"$CONFIG" || die "dflash-sidecar sample-config failed"
fi
if [[ ! -e $ETC/config.toml ]]; then
    put "$CONFIG" "$ETC/config.toml" 0644
elif ! cmp -s -- "$CONFIG" "$ETC/config.toml"; then
    put "$CONFIG" "$ETC/config.toml.dist" 0644
    say "kept your /etc/dflash-sidecar/config.toml; compare it with config.toml.dist"
fi
if [[ ! -e $ETC/env ]]; then
    put "$DEPLOY_DIR/systemd/env.template" "$ETC/env" 0600
    say "put WANDB_API_KEY in /etc/dflash-sidecar/env"
elif [[ $(stat -c %a -- "$ETC/env") != 600 ]]; then
    chmod 0600 -- "$ETC/env"
    say "kept /etc/dflash-sidecar/env but made it mode 0600 (it holds secrets)"
fi

# ---- examples and docs -------------------------------------------------------------------------

put "$DEPLOY_DIR/systemd/resources.conf.example" "$SHARE/systemd/resources.conf.example" 0644
for dir in prometheus grafana; do
    [[ -d $DEPLOY_DIR/$dir ]] || continue
    while IFS= read -r -d '' f; do
        put "$f" "$SHARE/$dir/${f#"$DEPLOY_DIR/$dir/"}" 0644
    done < <(find "$DEPLOY_DIR/$dir" -type f ! -name '*.pyc' -print0 | sort -z)
done
for f in "$DEPLOY_DIR/metric_names.txt" "$(dirname -- "$DEPLOY_DIR")/docs/DEPLOY.md"; do
    [[ -f $f ]] && put "$f" "$SHARE/doc/$(basename -- "$f")" 0644
done

# ---- the live system ---------------------------------------------------------------------------

if [[ -n $ROOT ]]; then
    skipped="creating user dflash-sidecar, systemd-tmpfiles --create, systemctl daemon-reload"
    if ((UPGRADE)); then
        skipped+=", systemctl try-restart ${SIDECAR_UNITS[*]}"
    fi
    say "scratch root $ROOT: skipped $skipped"
    exit 0
fi

if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers /etc/sysusers.d/dflash-sidecar.conf
elif ! id -u dflash-sidecar >/dev/null 2>&1; then
    useradd --system --user-group --home-dir /var/lib/dflash-sidecar --no-create-home \
        --shell /usr/sbin/nologin --comment "dflash-sidecar telemetry daemon" dflash-sidecar
fi
if [[ ${#TRAINER_USERS[@]} -gt 0 ]]; then
    for u in "${TRAINER_USERS[@]}"; do
        if id -nG -- "$u" | tr ' ' '\n' | grep -qx dflash-sidecar; then
            continue
        fi
        usermod -a -G dflash-sidecar "$u"
        say "added $u to group dflash-sidecar (takes effect for processes started after a new login)"
    done
fi
systemd-tmpfiles --create /etc/tmpfiles.d/dflash-sidecar.conf
if [[ ! -d /run/systemd/system ]]; then
    say "systemd is not running here (an image build?): skipped systemctl; the units load at boot"
    exit 0
fi
systemctl daemon-reload
if ((UPGRADE)); then
    say "restarting the running sidecar units only: systemctl try-restart ${SIDECAR_UNITS[*]}"
    systemctl try-restart "${SIDECAR_UNITS[@]}"
else
    say "done. Start one daemon per node:"
    say "  systemctl enable --now dflash-sidecar.service      # follows the trainer's W&B run"
    say "  systemctl start dflash-sidecar@<wandb-run-id>     # or: joins one W&B run"
fi
