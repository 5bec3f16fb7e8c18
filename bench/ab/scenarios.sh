# The loaderctl run flags of each A/B scenario, sourced by compare_builds.sh
# and telemetry_overhead.sh: zero-compute 3x224x224 over shared memory and
# gRPC, the image pipeline on IMAGES, and two small-batch cells.
scenario() {
  case "$1" in
    shm) echo "--batch-size 64 --samples 32000 --shape 3,224,224" ;;
    grpc) echo "--batch-size 64 --samples 16000 --shape 3,224,224 --transport grpc" ;;
    images) echo "--batch-size 64 --dataset imagefolder --path ${IMAGES:-bench/data/imagenet-shaped}" ;;
    small) echo "--batch-size 256 --samples 640000 --shape 3,32,32" ;;
    tokens1) echo "--batch-size 1 --samples 100000 --shape 2049 --dtype uint16" ;;
    *) echo "unknown scenario $1" >&2; return 1 ;;
  esac
}

# One JSON line for a `loaderctl run --json` report: build, scenario,
# samples_per_s, client_cpu_us_per_batch.
report() {
  python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(json.dumps({"build": sys.argv[2], "scenario": sys.argv[3], "samples_per_s": v["samples_per_s"], "client_cpu_us_per_batch": v.get("client_cpu_us_per_batch")}))' "$1" "$2" "$3"
}
