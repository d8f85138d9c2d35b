#!/usr/bin/env bash
# The device tool sends the tracked files with each call, 64 MiB at most; the default model's
# weights (models/fathom-tiny-moe, 40 MB) rarely need to travel. `hide` takes them out of the
# index and ignores them (the files stay on disk), `show` puts them back. Commit nothing between
# the two: a commit made while hidden would delete the model.
# usage: tools/device_tree.sh hide|show
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/fathom-tiny-moe
case ${1:-} in
  hide) git rm -r -q --cached "$MODEL" && echo "/$MODEL/" >> .git/info/exclude ;;
  show) sed -i "\#^/$MODEL/\$#d" .git/info/exclude && git reset -q -- "$MODEL" ;;
  *) echo "usage: $0 hide|show" >&2; exit 2 ;;
esac
