#!/usr/bin/env bash
# The one-command demo (called by `make demo` after `make install`; `deploy/demo.sh down` for `make down`).
#   up:   virtual board "vboard" (profile stm32mp25) -> Prefect server (SQLite under $ODL_HOME/prefect, telemetry off)
#         -> work pool odl-pool -> deployment odl/full (deploy/prefect.yaml) -> process worker
#         -> `odl watch odl/full` (creates the run, prints its stages, training and verdict) -> UI address.
#   nightly: the same stack, then three nights of recipes/digits_nightly.toml: each appends a shard to
#         the board's dataset folder (odl data push) and runs odl/full (warm start, new + replayed data,
#         the gate, rollout to the board).
#   teacher: the same with recipes/digits_teacher.toml: two nights of unlabeled shifted digits, labelled
#         on the board by a teacher model before each run (the board's only labels: the 100 clean
#         digits it was delivered with, its replay).
#   teacher-detection: the same with recipes/ssdlite_teacher.toml (a detector teacher's boxes; its data
#         take ~8 min to make the first time: the teacher trains on the host).
#   segmentation: the same with recipes/segmentation.toml: a U-Net fine-tuned on the board, judged on mIoU.
#   keypoints: the same with recipes/keypoints.toml: a heatmap U-Net fine-tuned on stick figures, judged on OKS AP.
#   fleet: four virtual boards lab1..lab4 (0.5 CPU each), each with its own non-IID share of the digits,
#         group "lab", then `odl watch odl/fleet`: three FedAvg rounds, the gate, rollout.
#         ODL_FLEET_RECIPE=recipes/digits_fleet_private.toml (`make fleet ODL_FLEET_RECIPE=...`): the
#         same fleet with central differential privacy: ε per round, the budget's stop.
#         ODL_FLEET_RECIPE=recipes/digits_fleet_buffered.toml: the buffered asynchronous mode (FedBuff).
#   down: stops the worker, the server (by the pids under $ODL_HOME/run) and the board; keeps the data.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export ODL_HOME=${ODL_HOME:-$PWD/.odl}
PORT_ARGS=()  # the stack picks this home's port (4200 when free) unless ODL_PREFECT_PORT says one
if [ -n "${ODL_PREFECT_PORT:-}" ]; then PORT_ARGS=(--port "$ODL_PREFECT_PORT"); fi
BOARD=${ODL_BOARD:-vboard}
FLEET_PREFIX=${ODL_FLEET_PREFIX:-lab}   # the fleet demo's boards: lab1 .. lab4
FLEET_RECIPE=${ODL_FLEET_RECIPE:-recipes/digits_fleet.toml}   # or digits_fleet_private / _buffered

stack_env() {  # the environment tasks.stack.server gives every process of the stack
  eval "$("$BIN/python" - <<'PY'
import shlex
from tasks.stack.server import stack_env
env = stack_env()  # the port, database and address `odl stack up` recorded for this ODL_HOME
for k in ("ODL_HOME", "ODL_PROJECT_ROOT", "ODL_TIMEZONE", "PREFECT_HOME", "PREFECT_API_URL",
          "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK", "PREFECT_LOGGING_EXTRA_LOGGERS"):
    print(f"export {k}={shlex.quote(env[k])}")
PY
)"
}

quietly() {  # run a set-up step with its log in $ODL_HOME/logs/demo.log; on failure show its tail
  mkdir -p "$ODL_HOME/logs"
  if ! "$@" >> "$ODL_HOME/logs/demo.log" 2>&1; then
    tail -20 "$ODL_HOME/logs/demo.log" >&2
    echo "failed: $* (whole log: $ODL_HOME/logs/demo.log)" >&2
    exit 1
  fi
}

board_and_stack() {  # the virtual board and this home's Prefect stack, two lines
  quietly "$BIN/odl" board up --name "$BOARD" --profile stm32mp25
  echo "board $BOARD up (a virtual STM32MP25: 4 GB, 2 CPUs at 0.25 CPU; \`odl board check $BOARD\`)"
  quietly "$BIN/odl" stack up "${PORT_ARGS[@]}"
  stack_env
  echo "Prefect server ${PREFECT_API_URL%/api} (SQLite under $PREFECT_HOME)"
}

nights() {  # RECIPE NAME DATASET SHARDS: delivered-*.npz on the board, then per shard: append it, run odl/full
  local recipe=$1 name=$2 dataset=$3 shards=$4
  "$BIN/python" -c "from tasks.recipe.load import load_recipe; from tasks import stages; \
stages.prepare_data(load_recipe('$recipe'))"
  # the virtual board outlives this host's registry (another clone, a removed .odl): a demo that
  # starts with no version of the recipe starts from an empty dataset folder on the board too
  "$BIN/python" - "$BOARD" "$name" "$dataset" <<'PY'
import posixpath, sys
from tasks import stages
from tasks.board.inventory import get_board
from tasks.board.transport import connect
board, name, dataset = get_board(sys.argv[1]), sys.argv[2], sys.argv[3]
if not stages.registry().versions(name, board.name):
    conn = connect(board)
    conn.run(["rm", "-rf", posixpath.join(board.root, dataset)])
    conn.close()
    print(f"board {board.name}: a fresh demo, {dataset} emptied")
PY
  for shard in "$shards"/delivered-*.npz; do  # labelled data the board holds before the first night
    if [ -e "$shard" ]; then "$BIN/odl" data push "$BOARD" "$shard" --to "$dataset"; fi
  done
  for shard in "$shards"/shard-000*.npz; do
    echo "== the board application appends $(basename "$shard") =="
    "$BIN/odl" data push "$BOARD" "$shard" --to "$dataset"
    "$BIN/odl" watch odl/full --kind nightly \
      --params "{\"recipe\": \"$recipe\", \"board\": \"$BOARD\"}" || true
  done
  echo
  "$BIN/odl" registry "$name" "$BOARD"
  "$BIN/odl" models "$name" "$BOARD"
  echo "Undo the last promotion on the board and in the registry: $BIN/odl rollback $name $BOARD"
}

case "${1:-up}" in
  up)
    # an STM32MP25 in RAM (4 GB cap), CPUs (2) and speed (0.25 CPU: two Cortex-A35), kernel-enforced
    board_and_stack
    start=$(date +%s)
    "$BIN/odl" watch odl/full --params "{\"board\": \"$BOARD\"}" --kind full
    echo "($(( $(date +%s) - start )) s for the run; \`odl registry digits $BOARD\` lists the versions)"
    echo "Prefect UI: ${PREFECT_API_URL%/api}  (Runs > the latest run > Artifacts: report, progress, epochs)"
    echo "Everything keeps running; stop it with: make down"
    ;;
  nightly)  # nightly continual learning: one shard appended on the board before each run
    board_and_stack
    nights recipes/digits_nightly.toml digits_nightly datasets/digits recipes/data/digits-nightly/shards
    ;;
  teacher)  # no label on the board: a teacher labels each night's unlabeled shard on the board
    board_and_stack
    nights recipes/digits_teacher.toml digits_teacher datasets/digits-unlabeled recipes/data/digits-teacher/shards
    ;;
  teacher-detection)  # the same for a detector: a larger SSD-Lite labels unlabeled shapes images
    board_and_stack
    nights recipes/ssdlite_teacher.toml ssdlite-teacher datasets/shapes-unlabeled recipes/data/shapes-teacher/shards
    ;;
  segmentation)  # a U-Net fine-tuned on the board on shifted shapes, promoted on a significant mIoU gain
    board_and_stack
    "$BIN/odl" watch odl/full --kind full \
      --params "{\"recipe\": \"recipes/segmentation.toml\", \"board\": \"$BOARD\"}" || true
    "$BIN/odl" registry segmentation "$BOARD"
    echo "Prefect UI: ${PREFECT_API_URL%/api}  (Runs > the latest run > Artifacts: per-class IoU, drawn masks)"
    ;;
  keypoints)  # a heatmap U-Net fine-tuned on the board on shifted stick figures, promoted on OKS AP
    board_and_stack
    "$BIN/odl" watch odl/full --kind full \
      --params "{\"recipe\": \"recipes/keypoints.toml\", \"board\": \"$BOARD\"}" || true
    "$BIN/odl" registry keypoints "$BOARD"
    echo "Prefect UI: ${PREFECT_API_URL%/api}  (Runs > the latest run > Artifacts: per-keypoint table, drawn keypoints)"
    ;;
  fleet)  # four boards, each with its own non-IID share of the digits, three FedAvg rounds
    "$BIN/python" -c "from tasks.recipe.load import load_recipe; from tasks import stages; \
stages.prepare_data(load_recipe('$FLEET_RECIPE'))"
    for i in 0 1 2 3; do
      b="${FLEET_PREFIX}$((i + 1))"
      # an STM32MP25 each (4 GB RAM cap, 2 CPUs) but 0.5 CPU (a kernel quota) instead of the profile's
      # 0.25, so the four boards share this machine's two cores and the demo stays short
      quietly "$BIN/odl" board up --name "$b" --profile stm32mp25 --cpu-quota 0.5
      "$BIN/python" - "$b" <<'PY'
import posixpath, sys
from tasks.board.inventory import get_board
from tasks.board.transport import connect
board = get_board(sys.argv[1])
conn = connect(board)  # a fresh demo: the board's own data is exactly its share of the split
conn.run(["rm", "-rf", posixpath.join(board.root, "datasets", "digits")])
conn.close()
PY
      quietly "$BIN/odl" data push "$b" "recipes/data/digits-fleet/boards-4/board-$i.npz" --to datasets/digits
      echo "board $b up with its share of the digits (board-$i.npz)"
    done
    "$BIN/odl" board group lab "${FLEET_PREFIX}1" "${FLEET_PREFIX}2" "${FLEET_PREFIX}3" "${FLEET_PREFIX}4"
    quietly "$BIN/odl" stack up "${PORT_ARGS[@]}"
    stack_env
    echo "Prefect server ${PREFECT_API_URL%/api}"
    "$BIN/odl" watch odl/fleet --kind fleet \
      --params "{\"recipe\": \"$FLEET_RECIPE\", \"group\": \"lab\"}" || true
    echo
    name=$("$BIN/python" -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['name'])" "$FLEET_RECIPE")
    "$BIN/python" - "$name" <<'PY'
import json, os, sys
from pathlib import Path
runs = sorted(Path(os.environ["ODL_HOME"], "fleet").glob(f"{sys.argv[1]}-lab-*/rounds.json"), key=os.path.getmtime)
summary = json.loads(runs[-1].read_text())
for rec in summary["rounds"]:
    boards = ", ".join(f"{b} {r['host']['accuracy']:.3f}" if r["status"] == "ok" else f"{b} {r['status']}"
                       for b, r in rec["boards"].items())
    if rec.get("mode") == "buffered":  # who arrived, how stale (global versions since its start)
        boards = ", ".join(f"{b} {r['host']['accuracy']:.3f} (staleness {r['staleness']})"
                           for b, r in rec["boards"].items() if r["status"] == "ok")
    agg = rec["aggregate"]["accuracy"] if rec["aggregate"] else float("nan")
    eps = f" | ε {rec['privacy']['epsilon']:.3g} (δ {rec['privacy']['delta']:g})" if rec.get("privacy") else ""
    print(f"round {rec['round']}: aggregate {agg:.4f} | each board's own update: {boards} | "
          f"{rec['bytes_up']} B up, {rec['bytes_down']} B down{eps}")
if summary.get("stopped"):
    print(f"stopped: {summary['stopped']}")
PY
    "$BIN/odl" registry "$name" lab
    echo "Prefect UI: ${PREFECT_API_URL%/api}  (Runs > the latest $name@lab run > Artifacts: the fleet report)"
    ;;
  down)
    "$BIN/odl" stack down
    "$BIN/odl" board down --name "$BOARD" || true
    for i in 1 2 3 4; do
      if [ -d "$ODL_HOME/boards/${FLEET_PREFIX}$i" ]; then "$BIN/odl" board down --name "${FLEET_PREFIX}$i" || true; fi
    done
    ;;
  *)
    echo "usage: $0 [up|nightly|teacher|teacher-detection|segmentation|keypoints|fleet|down]" >&2; exit 2 ;;
esac
