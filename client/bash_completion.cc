#include "client/bash_completion.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::client {

std::string BashCompletion(const std::vector<std::string>& flags) {
  std::vector<std::string> options;
  for (const std::string& flag : flags) options.push_back((flag.size() == 1 ? "-" : "--") + flag);
  options.push_back("--help");
  return absl::StrCat(R"(# bash completion for shardctl: source <(shardctl completion bash)
_shardctl_coordinator_flag() {
  local word
  for word in "${COMP_WORDS[@]}"; do
    case $word in --coordinator=*) echo "$word"; return ;; esac
  done
}
_shardctl_list() {  # ids of jobs or names of workers (first column), as the coordinator lists them now
  shardctl $(_shardctl_coordinator_flag) get "$1" 2>/dev/null | awk 'NR > 1 {print $1}'
}
_shardctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} words="" i command="" arguments=0
  for ((i = 1; i < COMP_CWORD; ++i)); do
    case ${COMP_WORDS[i]} in
      -o|--steps|--coordinator|--watch_seconds) ((++i)) ;;
      -*) ;;
      *) if [[ -z $command ]]; then command=${COMP_WORDS[i]}; else ((++arguments)); fi ;;
    esac
  done
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W ")", absl::StrJoin(options, " "), R"(" -- "$cur"))
    return
  fi
  case $command in
    "") words="get describe plan submit watch cancel replan delete drain undrain probe export health trace completion" ;;
    get) [[ $arguments -eq 0 ]] && words="workers jobs links" ;;
    describe) if [[ $arguments -eq 0 ]]; then words="job"; elif [[ $arguments -eq 1 ]]; then words=$(_shardctl_list jobs); fi ;;
    watch|cancel|replan|delete|export|trace) [[ $arguments -eq 0 ]] && words=$(_shardctl_list jobs) ;;
    drain|undrain) [[ $arguments -eq 0 ]] && words=$(_shardctl_list workers) ;;
    probe) words=$(_shardctl_list workers) ;;
    completion) [[ $arguments -eq 0 ]] && words="bash" ;;
    plan|submit) [[ $arguments -eq 0 ]] && { COMPREPLY=($(compgen -f -- "$cur")); return; } ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _shardctl shardctl
)");
}

}  // namespace shardline::client
