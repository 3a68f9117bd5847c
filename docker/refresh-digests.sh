#!/usr/bin/env bash
# Re-pins the Dockerfile's base images: for every `# tag: IMAGE:TAG` comment,
# the ARG line below it becomes IMAGE:TAG@sha256:<digest of the tag now>.
# Run it on a machine that can reach the registry, review the diff, commit.
#
#   refresh-digests.sh [--dockerfile FILE]      rewrite the pins
#   refresh-digests.sh --check [--dockerfile FILE]
#       read only: exit 0 when every FROM uses an ARG pinned as
#       NAME:TAG@sha256:<64 hex> under its `# tag:` comment and no pin is the
#       all-zero placeholder; exit 1 naming the first that is not
#   refresh-digests.sh --help
#
# The digest is the sha256 of the tag's raw manifest (an image index for
# multi-platform images), read with `docker buildx imagetools inspect --raw`.
#
# Exit: 0 done; 1 --check found an unpinned or unresolved image; 2 bad usage,
# a malformed Dockerfile or a tag that does not resolve (nothing written).
set -euo pipefail
KVTIER_TOOL=refresh-digests
# shellcheck source=docker/lib.sh
. "$(dirname "$0")/lib.sh"

dockerfile=$(dirname "$0")/Dockerfile check=0
while (($#)); do
  case $1 in
  --dockerfile)
    (($# >= 2)) || die "$1 needs a value"
    dockerfile=$2
    shift 2
    ;;
  --check)
    check=1
    shift
    ;;
  *) other_arg "$0" "$1" ;;
  esac
done
[[ -f $dockerfile ]] || die "$dockerfile: does not exist"

zero=$(printf '0%.0s' {1..64})
mapfile -t lines <"$dockerfile"
out=() tag="" pinned=" "
for i in "${!lines[@]}"; do
  line=${lines[$i]}
  if [[ $line =~ ^#\ tag:\ ([^[:space:]]+:[^[:space:]]+)$ ]]; then
    tag=${BASH_REMATCH[1]}
  elif [[ -n $tag ]]; then
    [[ $line =~ ^ARG\ ([A-Z_]+)=([^[:space:]]+)$ ]] ||
      die "$dockerfile:$((i + 1)): expected an ARG line under '# tag: $tag'"
    name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
    if ((check)); then
      [[ $value =~ ^(.+)@sha256:([0-9a-f]{64})$ && ${BASH_REMATCH[1]} == "$tag" ]] || {
        log "$dockerfile:$((i + 1)): $name is not pinned as $tag@sha256:<digest>"
        exit 1
      }
      [[ ${BASH_REMATCH[2]} != "$zero" ]] || {
        log "$dockerfile:$((i + 1)): $name's digest is the unresolved placeholder; run docker/refresh-digests.sh"
        exit 1
      }
    else
      raw=$(docker buildx imagetools inspect --raw "$tag") || die "$tag: cannot read its manifest"
      [[ -n $raw ]] || die "$tag: empty manifest"
      digest=$(printf '%s' "$raw" | sha256sum)
      line="ARG $name=$tag@sha256:${digest:0:64}"
      [[ $line == "${lines[$i]}" ]] || log "$name: $tag@sha256:${digest:0:64}"
    fi
    pinned+="$name "
    tag=""
  fi
  out+=("$line")
done

# Every FROM must go through a pinned ARG.
for line in "${lines[@]}"; do
  [[ $line =~ ^FROM[[:space:]]+(--[^[:space:]]+[[:space:]]+)*([^[:space:]]+) ]] || continue
  from=${BASH_REMATCH[2]}
  [[ $from =~ ^\$\{([A-Z_]+)\}$ && $pinned == *" ${BASH_REMATCH[1]} "* ]] || {
    log "$dockerfile: FROM $from does not use a pinned '# tag:' ARG"
    exit $((check ? 1 : 2))
  }
done
((check)) && {
  log "ok: every base image pinned by digest"
  exit 0
}
tmp=$(mktemp "$dockerfile.XXXXXX")
printf '%s\n' "${out[@]}" >"$tmp"
chmod --reference="$dockerfile" "$tmp"
mv "$tmp" "$dockerfile"
log "rewrote $dockerfile"
