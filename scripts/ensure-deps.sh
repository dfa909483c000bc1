# Sourced by the other scripts: installs the Debian packages seqattn's build,
# tests, examples and benchmarks need, when any is missing. Needs root or sudo
# only when something must be installed.
# ccache and ninja-build: compiler cache and build tool for scripts/test.sh. clang + libclang-rt-14-dev:
# libFuzzer (fuzz stage). libopenmpi-dev + openmpi-bin: ring attention over
# MPI. python3-dev + python3-venv: the Python package (python stage). doxygen:
# the API reference (target seqattn_docs, checked by CTest docs.api_reference).
seqattn_packages=(cmake make ninja-build g++ libhwy-dev catch2 libbenchmark-dev clang-format ccache clang libclang-rt-14-dev
  libopenmpi-dev openmpi-bin python3-dev python3-venv doxygen)

seqattn_missing=()
for pkg in "${seqattn_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    seqattn_missing+=("$pkg")
  fi
done

if ((${#seqattn_missing[@]})); then
  echo "seqattn: installing missing Debian packages: ${seqattn_missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    seqattn_sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    seqattn_sudo=(sudo)
  else
    echo "seqattn: need root or sudo to install: ${seqattn_missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${seqattn_sudo[@]}" apt-get update
  "${seqattn_sudo[@]}" apt-get install -y --no-install-recommends "${seqattn_missing[@]}"
fi
