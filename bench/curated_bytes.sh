#!/usr/bin/env bash
# The byte-identity check of a refactor (issue 42): sha256 of every parquet file a curate run writes
# (curated, every stage's removed/, quarantine/) for
#   demo    the demo corpus with configs/curate/demo.yaml,
#   text    ../shared/data/text with configs/curate/default.yaml,
#   webpdf  the shared WARCs (top level + constructed) and every shared PDF with configs/curate/default.yaml,
# bad_words and decontam on, long time limits (an OCR page timing out under load would differ by load,
# not by code). Record ids hash the input path, so both checkouts must read the SAME paths: the demo
# corpus is built once into DEMO_CORPUS (default /tmp/quipu-bytes-demo-corpus) and reused, and the
# shared data is read through its resolved path.
# usage: bench/curated_bytes.sh REPO OUTDIR   then: diff OLD_OUT/sha256.txt NEW_OUT/sha256.txt
set -euo pipefail
repo=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
shared=$(cd "$repo/../shared/data" && pwd -P)
demo_corpus=${DEMO_CORPUS:-/tmp/quipu-bytes-demo-corpus}
cd "$repo"
export QUIPU_HOME=$out/home PREFECT_HOME=$out/prefect QUIPU_VERBOSITY=quiet
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=600   # the server starts slowly on a loaded machine
q=$repo/.venv/bin/quipu
[ -f "$demo_corpus/manifest.json" ] || "$repo/.venv/bin/python" -c \
  "from quipu.synthetic.corpus import build_demo_corpus; build_demo_corpus('$demo_corpus', 1.0)" >/dev/null
lim=(--set extract.timeout_s=600 --set extract.pdf.page_timeout_s=1200)
on=(--set bad_words.enabled=true --set decontam.enabled=true "${lim[@]}" --allow-empty)
$q curate configs/curate/demo.yaml --input "$demo_corpus/raw" --output "$out/demo" "${on[@]}" >"$out/demo.log" 2>&1
$q curate configs/curate/default.yaml --input "$shared/text" --output "$out/text" "${on[@]}" >"$out/text.log" 2>&1
web=()
for f in "$shared"/web/*.warc* "$shared"/web/constructed/*.warc* "$shared"/pdf/*.pdf; do web+=(--input "$f"); done
$q curate configs/curate/default.yaml "${web[@]}" --output "$out/webpdf" "${on[@]}" >"$out/webpdf.log" 2>&1
(cd "$out" && find demo text webpdf -name '*.parquet' | sort | xargs -r sha256sum) > "$out/sha256.txt"
echo "$(wc -l < "$out/sha256.txt") parquet files hashed: $out/sha256.txt"
