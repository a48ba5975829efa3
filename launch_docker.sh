#!/usr/bin/env bash
# Build the docker image of one backend (only if it is missing) and run run_mlperf.py in it.
#   ./launch_docker.sh [OPTIONS] [--] [run_mlperf.py ARGUMENTS]
# Without run_mlperf.py arguments it opens a shell in the container. --help lists the options.
set -euo pipefail
repo="$(cd "$(dirname "$0")" && pwd -P)"
me="launch_docker.sh"

usage() {
  cat <<EOF
Usage: ./launch_docker.sh [OPTIONS] [--] [run_mlperf.py ARGUMENTS]

Builds the image gptoss-mlperf-<backend>:<version> from docker/Dockerfile.<backend> if it is
missing, then runs \`python3 run_mlperf.py --backend B --output-dir /output [--model-path /models]
ARGUMENTS\` in it, or a shell when no ARGUMENTS are given. Arguments after \`--\`, and any this
script does not know, go to run_mlperf.py unchanged.

  --backend NAME     gptoss | vllm | sglang              [\$MLPERF_BACKEND, else gptoss]
  --model-dir DIR    checkpoint dir, mounted read-only at /models; adds --model-path /models
                                                         [\$MLPERF_MODEL_DIR, else not mounted]
  --data-dir DIR     dataset dir, mounted read-only at /data (use --input-file /data/...)
                                                         [\$MLPERF_DATA_DIR, else not mounted]
  --output-dir DIR   results dir, mounted at /output     [\$MLPERF_OUTPUT_DIR, else ./output]
  --hf-cache DIR     Hugging Face cache, mounted at /cache/huggingface (HF_HOME)
                                  [\$MLPERF_HF_CACHE, else \$HF_HOME, else ~/.cache/huggingface]
  --compile-cache DIR  kernel caches (Triton, TorchInductor, vLLM, FlashInfer, CUDA), mounted at
                     /cache/compile: after the first run, containers start warm and time no
                     compiles; 'none': each container compiles afresh
                                  [\$MLPERF_COMPILE_CACHE, else ~/.cache/gptoss-mlperf/compile]
  --gpus SPEC        docker run --gpus value, 'none' to omit it     [\$MLPERF_GPUS, else all]
  --network MODE     docker run --network, e.g. host   [\$MLPERF_DOCKER_NETWORK, else default]
  -e, --env K=V      extra environment variable for the container (repeatable)
  --image NAME       image tag to build and run          [\$MLPERF_IMAGE]
  --base-image REF   replace the Dockerfile's pinned base image     [\$MLPERF_BASE_IMAGE]
  --rebuild          build even if the image exists
  --mount-source     mount this checkout over the image's copy (code edits without rebuilds)
  --dry-run          print the docker commands instead of running them
  -h, --help         this text

The container runs as your uid:gid with --ipc=host and the ulimits vLLM and SGLang need.
Exit status: that of the container; 2 for a usage error; 3 when no Docker engine answers.
EOF
}

die() { echo "$me: $*" >&2; exit 2; }

backend="${MLPERF_BACKEND:-gptoss}"
model_dir="${MLPERF_MODEL_DIR:-}"
data_dir="${MLPERF_DATA_DIR:-}"
output_dir="${MLPERF_OUTPUT_DIR:-$repo/output}"
hf_cache="${MLPERF_HF_CACHE:-${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}}"
compile_cache="${MLPERF_COMPILE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gptoss-mlperf/compile}"
gpus="${MLPERF_GPUS:-all}"
network="${MLPERF_DOCKER_NETWORK:-}"
image="${MLPERF_IMAGE:-}"
base_image="${MLPERF_BASE_IMAGE:-}"
rebuild=0
dry_run=0
mount_source=0
envs=()
passthrough=()

set_option() {
  case "$1" in
    --backend) backend="$2" ;;
    --model-dir) model_dir="$2" ;;
    --data-dir) data_dir="$2" ;;
    --output-dir) output_dir="$2" ;;
    --hf-cache) hf_cache="$2" ;;
    --compile-cache) compile_cache="$2" ;;
    --gpus) gpus="$2" ;;
    --network) network="$2" ;;
    -e|--env) [[ "$2" == ?*=* ]] || die "$1 takes KEY=VALUE, got '$2'"; envs+=("$2") ;;
    --image) image="$2" ;;
    --base-image) base_image="$2" ;;
  esac
}

while [ $# -gt 0 ]; do
  case "$1" in
    --backend|--model-dir|--data-dir|--output-dir|--hf-cache|--compile-cache|--gpus|--network|-e|--env|--image|--base-image)
      [ $# -ge 2 ] || die "$1 needs a value"
      set_option "$1" "$2"; shift 2 ;;
    --backend=*|--model-dir=*|--data-dir=*|--output-dir=*|--hf-cache=*|--compile-cache=*|--gpus=*|--network=*|--env=*|--image=*|--base-image=*)
      set_option "${1%%=*}" "${1#*=}"; shift ;;
    --rebuild) rebuild=1; shift ;;
    --mount-source) mount_source=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; passthrough+=("$@"); break ;;
    *) passthrough+=("$1"); shift ;;
  esac
done

case "$backend" in
  gptoss|vllm|sglang) ;;
  openai) die "the openai backend is an HTTP client with no image of its own: run it on the host (./setup.sh --backend openai), or use the sglang image" ;;
  *) die "unknown backend '$backend'; choose gptoss, vllm or sglang (--backend or MLPERF_BACKEND)" ;;
esac

# run_mlperf.py gets --backend and --output-dir from here; a different value would run another
# engine than the image holds, or write the results where they vanish with the container.
i=0
while [ $i -lt ${#passthrough[@]} ]; do
  arg="${passthrough[$i]}"
  value=""
  case "$arg" in
    --backend|--output-dir) value="${passthrough[$((i + 1))]:-}" ;;
    --backend=*|--output-dir=*) value="${arg#*=}" ;;
  esac
  case "$arg" in
    --backend|--backend=*)
      [ "$value" = "$backend" ] || die "run_mlperf.py --backend '$value' does not match the $backend image; give launch_docker.sh --backend instead" ;;
    --output-dir|--output-dir=*)
      [[ "$value" == /output || "$value" == /output/* ]] || die "run_mlperf.py --output-dir '$value' is outside the mounted /output, so the results would vanish with the container; give launch_docker.sh --output-dir HOST_DIR instead" ;;
  esac
  i=$((i + 1))
done

# Absolute host path for a bind mount; docker's -v syntax cannot carry a ':' in it.
host_path() {
  local path="$1" what="$2"
  [[ "$path" != *:* ]] || die "$what '$path' contains ':', which docker -v cannot mount"
  if [ -d "$path" ]; then (cd "$path" && pwd -P)
  elif [[ "$path" == /* ]]; then echo "$path"
  else echo "$PWD/${path#./}"
  fi
}
for pair in "model_dir:--model-dir" "data_dir:--data-dir"; do
  var="${pair%%:*}"
  [ -z "${!var}" ] || [ -d "${!var}" ] || die "${pair#*:} '${!var}' is not a directory"
done
[ -z "$model_dir" ] || model_dir="$(host_path "$model_dir" --model-dir)"
[ -z "$data_dir" ] || data_dir="$(host_path "$data_dir" --data-dir)"
output_dir="$(host_path "$output_dir" --output-dir)"
hf_cache="$(host_path "$hf_cache" --hf-cache)"
[ "$compile_cache" = none ] || compile_cache="$(host_path "$compile_cache" --compile-cache)"

version="$(awk -F'"' '/^\[/ { in_project = ($0 == "[project]") } in_project && /^version *=/ { print $2; exit }' "$repo/pyproject.toml")"
[ -n "$version" ] || die "no version in $repo/pyproject.toml"
image="${image:-gptoss-mlperf-$backend:$version}"
vcs_ref=unknown
if git -C "$repo" rev-parse --verify -q HEAD > /dev/null 2>&1; then
  vcs_ref="$(git -C "$repo" rev-parse HEAD)"
  [ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] || vcs_ref="$vcs_ref-dirty"
fi

build_cmd=(docker build --file "$repo/docker/Dockerfile.$backend" --tag "$image"
  --build-arg "PROJECT_VERSION=$version" --build-arg "VCS_REF=$vcs_ref")
[ -z "$base_image" ] || build_cmd+=(--build-arg "BASE_IMAGE=$base_image")
build_cmd+=("$repo")

run_cmd=(docker run --rm --init -i)
if [ -t 0 ] && [ -t 1 ]; then run_cmd+=(-t); fi
[ "$gpus" = none ] || run_cmd+=(--gpus "$gpus")
run_cmd+=(--ipc=host --ulimit memlock=-1 --ulimit stack=67108864 --ulimit nofile=1048576:1048576
  --user "$(id -u):$(id -g)")
[ -z "$network" ] || run_cmd+=(--network "$network")
run_cmd+=(-v "$output_dir:/output" -v "$hf_cache:/cache/huggingface")
[ "$compile_cache" = none ] || run_cmd+=(-v "$compile_cache:/cache/compile")
[ -z "$model_dir" ] || run_cmd+=(-v "$model_dir:/models:ro")
[ -z "$data_dir" ] || run_cmd+=(-v "$data_dir:/data:ro")
[ "$mount_source" = 0 ] || run_cmd+=(-v "$repo:/opt/gptoss-mlperf")
run_cmd+=(-e "MLPERF_BACKEND=$backend" -e HF_HOME=/cache/huggingface)
# Each compiler's cache under the mount. Without it every --rm container compiles every kernel again:
# gpt-oss-120b on our engine started in 97 s cold against 42 s warm, and a cold Offline run timed
# 9 Triton compiles (14.8 s) inside its measurement (bench/results v45, v48). vLLM's torch.compile
# cache follows XDG_CACHE_HOME; FlashInfer appends .cache/flashinfer to its base.
[ "$compile_cache" = none ] || run_cmd+=(-e XDG_CACHE_HOME=/cache/compile -e TRITON_CACHE_DIR=/cache/compile/triton
  -e TORCHINDUCTOR_CACHE_DIR=/cache/compile/torchinductor -e FLASHINFER_WORKSPACE_BASE=/cache/compile
  -e CUDA_CACHE_PATH=/cache/compile/nv)
[ -z "${HF_TOKEN:-}" ] || run_cmd+=(-e HF_TOKEN)  # by name: the value stays out of argv and logs
for kv in ${envs[@]+"${envs[@]}"}; do run_cmd+=(-e "$kv"); done
if [ ${#passthrough[@]} -eq 0 ]; then
  run_cmd+=("$image" bash)
else
  run_cmd+=("$image" python3 run_mlperf.py --backend "$backend" --output-dir /output)
  [ -z "$model_dir" ] || run_cmd+=(--model-path /models)
  run_cmd+=("${passthrough[@]}")
fi

show() { local line; printf -v line '%q ' "$@"; printf '%s\n' "${line% }"; }

# Is there an engine? `docker info` is the cheapest call that needs one.
engine_error=""
if ! command -v docker > /dev/null 2>&1; then
  engine_error="the docker CLI is not installed (see https://docs.docker.com/engine/install/)"
elif ! engine_error="$(docker info --format '{{.ServerVersion}}' 2>&1 > /dev/null)"; then
  engine_error="no Docker engine answers: ${engine_error:-docker info failed}"
else
  engine_error=""
fi

present=0
built_from=""
if [ -z "$engine_error" ] && [ "$rebuild" = 0 ] &&
  built_from="$(docker image inspect --format '{{index .Config.Labels "org.opencontainers.image.revision"}}' "$image" 2> /dev/null)"; then
  present=1
  [ "$built_from" != "<no value>" ] || built_from=""
fi

if [ "$dry_run" = 1 ]; then
  if [ -n "$engine_error" ]; then
    echo "# $engine_error"
    echo "# so whether $image exists is unknown: the build runs only if it is missing (or with --rebuild)"
    show "${build_cmd[@]}"
  elif [ "$present" = 1 ]; then
    echo "# $image exists: no build (--rebuild forces one)"
  else
    show "${build_cmd[@]}"
  fi
  show "${run_cmd[@]}"
  exit 0
fi

if [ -n "$engine_error" ]; then
  cat >&2 <<EOF
$me: cannot build or run the $backend image: $engine_error
  Start the engine (e.g. \`sudo systemctl start docker\`) or point DOCKER_HOST
  (or \`docker context use\`) at one that runs; on "permission denied", join the docker group.
  \`./launch_docker.sh --dry-run ...\` prints the docker commands without an engine.
EOF
  exit 3
fi

# Made here, owned by the caller: a missing bind-mount source would be created by root.
mkdir -p "$output_dir" "$hf_cache"
[ "$compile_cache" = none ] || mkdir -p "$compile_cache"
if [ "$present" = 0 ]; then
  echo "$me: building $image (docker/Dockerfile.$backend)" >&2
  echo "+ $(show "${build_cmd[@]}")" >&2
  "${build_cmd[@]}"
elif [ "$built_from" != "$vcs_ref" ] && [ "$mount_source" = 0 ]; then
  echo "$me: note: $image was built from ${built_from:-an unknown revision}, this checkout is $vcs_ref;" \
    "--rebuild brings the image up to date, --mount-source runs this checkout's code in it" >&2
fi
echo "+ $(show "${run_cmd[@]}")" >&2
exec "${run_cmd[@]}"
