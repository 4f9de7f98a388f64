#!/bin/bash
# Prints, one per line, the arguments a verl example script passes to verl's entry point (main_ppo or the
# SFT trainer), after the shell has expanded them: what `verl train` / `verl sft` receive instead.
# Usage: extract_args.sh SCRIPT [ARGS...]. Downloads and launchers in the script are stubbed out.
entry() { if [ "$1" = "-m" ] && [[ "$2" == verl.trainer.* || "$2" == verl.experimental.*.main_ppo || "$2" == verl.experimental.*.fully_async_main ]]; then shift 2; printf '%s\n' "$@"; fi; }
python3() { entry "$@"; }
python() { entry "$@"; }
# torchrun's rank counts are `verl sft`'s trainer.nnodes / trainer.n_gpus_per_node (it starts its own workers).
torchrun() {
  while [ "$1" != "-m" ]; do
    case "$1" in
      --nproc_per_node=*) printf 'trainer.n_gpus_per_node=%s\n' "${1#*=}" ;;
      --nnodes=*) printf 'trainer.nnodes=%s\n' "${1#*=}" ;;
    esac
    shift
  done
  shift 2; printf '%s\n' "$@"
}
echo() { :; }; huggingface-cli() { :; }; hf() { :; }; wait() { :; }; nvidia-smi() { :; }; pip() { :; }; ray() { :; }; mkdir() { :; }
conda() { :; }
export HOME=/HOME SLURM_JOB_NUM_NODES=1 MODEL_PATH=/HOME/models/model
script="$1"
shift
source "$script" 2>/dev/null
